"""The Flink compiler without a cluster: what it generates from the DSL and what it refuses."""

from __future__ import annotations

import pytest

from feature_defs import catalogue
from feature_defs.compile.flink import FlinkCompileError, SourceOptions, flink_job
from feature_defs.compile.flink_live import LIVE_FUNCTION, LIVE_FUNCTION_DDL
from feature_defs.compile.streaming import streaming_plan, streaming_plans
from feature_defs.dsl import Feature, FeatureView, count, sum_
from feature_defs.entities import user
from feature_defs.sources import chat_messages, interactions

FILES = SourceOptions(path="/data/stream/interactions")


def test_one_job_computes_every_streaming_view_of_a_source():
    spec = flink_job("j", streaming_plans(catalogue), FILES, "/sink")
    assert set(spec.views) == {"user_activity_realtime", "item_trending", "item_sales_today"}
    assert len(spec.inserts) == 4  # three views and the job's own counts
    windows = {
        view: "CUMULATE(TABLE" if "CUMULATE(TABLE" in i else "HOP(TABLE" if "HOP(TABLE" in i else None
        for view, i in zip(["_metrics", *spec.views], spec.inserts)
    }
    assert windows == {
        "_metrics": None,
        "user_activity_realtime": "HOP(TABLE",
        "item_trending": "HOP(TABLE",
        "item_sales_today": "CUMULATE(TABLE",
    }
    assert "WATERMARK FOR `event_timestamp`" in spec.statements[0]
    assert spec.views["item_trending"].push_source == "item_trending_push"


def test_live_rows_of_counts_and_last_n_come_from_our_live_window_function():
    spec = flink_job("j", streaming_plans(catalogue), FILES, "/sink", live_rows=True)
    live = {view: info.live for view, info in spec.views.items()}
    assert live == {
        "user_activity_realtime": "/sink/user_activity_realtime__live",
        "item_trending": "/sink/item_trending__live",
        "item_sales_today": None,  # running totals: window ends only
    }
    calls = [i for i in spec.inserts if f"`{LIVE_FUNCTION}`(input => TABLE" in i]
    assert len(calls) == 2 and all("window_millis => CAST(3600000 AS BIGINT)" in i for i in calls)
    assert "n => 5, numeric_values => TRUE" in calls[0]  # last_played_items_1h: item ids, compared as numbers
    assert "CAST(latest AS ARRAY<BIGINT>)" in calls[0]
    assert spec.statements.count(LIVE_FUNCTION_DDL) == 1
    assert "<= CURRENT_WATERMARK" in " ".join(spec.statements)  # an event at the watermark is late for both
    assert (
        flink_job("j", streaming_plans(catalogue), FILES, "/sink", mode="batch", live_rows=True)
        .views["item_trending"]
        .live
        is None
    )


def test_live_rows_of_other_kinds_are_an_over_aggregation():
    spend = FeatureView(
        "spend", [user], interactions, streaming=True, features=[Feature("spend_1h", sum_("amount", "1h"))]
    )
    spec = flink_job("j", [streaming_plan(spend)], FILES, "/sink", live_rows=True)
    (over,) = [i for i in spec.inserts if "OVER w" in i]
    assert "RANGE BETWEEN INTERVAL '0 00:59:59.999'" in over
    assert LIVE_FUNCTION_DDL not in spec.statements


def test_batch_mode_has_no_watermark_and_no_directory_monitoring():
    spec = flink_job("j", streaming_plans(catalogue), FILES, "/sink", mode="batch")
    assert "WATERMARK" not in spec.statements[0] and "monitor-interval" not in spec.statements[0]
    assert "CURRENT_WATERMARK" not in " ".join(spec.statements)


def test_files_are_read_by_our_connector_which_parses_each_line_once():
    for mode in ("streaming", "batch"):
        ddl, parsed = flink_job("j", streaming_plans(catalogue), FILES, "/sink", mode=mode).statements[:2]
        assert "'connector' = 'ordered-files'" in ddl and "is_json_object BOOLEAN" in ddl
        assert "`$.user_id` STRING" in ddl and "TRY_CAST(`$.user_id` AS BIGINT) AS `user_id`" in parsed
        assert "JSON_VALUE" not in ddl + parsed
        assert ("'source.monitor-interval' = '1000ms'" in ddl) == (mode == "streaming")


def test_kafka_source_options():
    kafka = SourceOptions(kind="kafka", bootstrap_servers="kafka:9092", topic="mlplane.interactions")
    ddl, parsed = flink_job("j", streaming_plans(catalogue), kafka, "/sink").statements[:2]
    assert "'connector' = 'kafka'" in ddl and "'topic' = 'mlplane.interactions'" in ddl
    assert "line STRING" in ddl and "TRY_CAST(JSON_VALUE(line, '$.user_id') AS BIGINT) AS `user_id`" in parsed
    with pytest.raises(FlinkCompileError, match="bootstrap_servers"):
        flink_job("j", streaming_plans(catalogue), SourceOptions(kind="kafka"), "/sink")


def test_refusals_name_the_problem():
    mixed = FeatureView(
        "mixed_windows",
        [user],
        interactions,
        streaming=True,
        features=[Feature("a_1h", count("1h")), Feature("a_2h", count("2h"))],
    )
    with pytest.raises(FlinkCompileError, match="mixed_windows.*share one window"):
        flink_job("j", [streaming_plan(mixed)], FILES, "/sink")
    sliding_and_running = FeatureView(
        "sliding_and_running",
        [user],
        interactions,
        streaming=True,
        features=[Feature("a_1d", count("1d")), Feature("a_today", count("1d", running=True))],
    )
    with pytest.raises(FlinkCompileError, match=r"sliding_and_running.*share one window.*'86400s running'"):
        flink_job("j", [streaming_plan(sliding_and_running)], FILES, "/sink")
    odd = FeatureView("odd_slide", [user], interactions, streaming=True, features=[Feature("a_1h", count("1h"))])
    with pytest.raises(FlinkCompileError, match="not a multiple of the slide"):
        flink_job("j", [streaming_plan(odd)], FILES, "/sink", slide_seconds=7)
    odd_running = FeatureView(
        "odd_running", [user], interactions, streaming=True, features=[Feature("a_today", count("1d", running=True))]
    )
    with pytest.raises(FlinkCompileError, match="odd_running.*not a multiple of the slide"):
        flink_job("j", [streaming_plan(odd_running)], FILES, "/sink", slide_seconds=7 * 60)
    chats = FeatureView(
        "chats",
        [user],
        chat_messages,
        streaming=True,
        entity_columns={"user_id": "sender_id"},
        features=[Feature("messages_1h", count("1h"))],
    )
    with pytest.raises(FlinkCompileError, match="one job per source"):
        flink_job("j", [streaming_plan(odd), streaming_plan(chats)], FILES, "/sink")
