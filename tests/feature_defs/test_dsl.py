from datetime import UTC, date, datetime

import duckdb
import polars as pl
import pytest

from feature_defs import catalogue
from feature_defs.dsl import Catalogue, Feature, FeatureDefinitionError, FeatureView, Source, count, mean, ratio, sum_
from feature_defs.entities import item, user
from feature_defs.expr import col
from feature_defs.sources import interactions, item_geometry, items


def test_catalogue_is_realistic():
    assert catalogue.feature_count >= 30
    assert len(catalogue.views) >= 5
    assert {s.name for s in catalogue.services} >= {"personalization_ranking", "search", "safety"}
    entity_sets = {tuple(v.join_keys) for v in catalogue.views}
    assert {("user_id",), ("item_id",), ("user_id", "item_id")} <= entity_sets
    assert any(v.streaming for v in catalogue.views)


def test_unknown_column_names_the_definition():
    with pytest.raises(FeatureDefinitionError, match=r"feature view 'bad_view', feature 'clicks_7d'.*'evnt_type'"):
        FeatureView(
            "bad_view", [user], interactions, [Feature("clicks_7d", count("7d", where=col("evnt_type") == "click"))]
        )


def test_window_on_a_non_timestamp_is_rejected():
    with pytest.raises(FeatureDefinitionError, match=r"source 'prices'.*timestamp.*'price' is float64"):
        Source("prices", kind="events", timestamp_field="price", schema={"price": "float64", "user_id": "int64"})


def test_duplicate_feature_names_are_rejected():
    with pytest.raises(FeatureDefinitionError, match=r"feature view 'dupes': duplicate feature name 'clicks_7d'"):
        FeatureView(
            "dupes", [user], interactions, [Feature("clicks_7d", count("7d")), Feature("clicks_7d", count("1d"))]
        )


def test_duplicate_view_names_in_catalogue_are_rejected():
    v = catalogue.view("user_engagement")
    with pytest.raises(FeatureDefinitionError, match="duplicate feature view name.*user_engagement"):
        Catalogue(entities=(user,), sources=(interactions,), views=(v, v), services=())


@pytest.mark.parametrize(
    "spec, message",
    [
        (lambda: sum_("event_type", "7d"), "sum of a non-numeric"),
        (lambda: ratio("missing", "clicks"), "not a feature defined earlier"),
        (lambda: count("7 days"), "not a duration"),
        (lambda: mean("price", "1d"), "unknown column"),
    ],
)
def test_other_invalid_specs(spec, message):
    with pytest.raises(FeatureDefinitionError, match=message):
        FeatureView("v", [user], interactions, [Feature("clicks", count("1d")), Feature("x", spec())])


def test_entity_key_must_exist_in_source():
    with pytest.raises(FeatureDefinitionError, match=r"entity 'item' is keyed by column 'item_id'"):
        FeatureView(
            "v",
            [item],
            Source("s", "events", "ts", {"ts": "timestamp", "user_id": "int64"}),
            [Feature("n", count("1d"))],
        )


def test_expressions_mean_the_same_in_polars_and_sql():
    """Each expression's SQL (for Flink) evaluates like its polars form; DuckDB stands in for Flink's SQL."""
    frame = pl.DataFrame(
        {
            "event_type": ["click", "play", "impression", None],
            "price": [1.0, 0.0, 99.5, None],
            "title": ["red car", "", "blue hat", "x"],
            "n": [1, 2, 3, 4],
        }
    )
    exprs = [
        (col("event_type") == "click") | (col("price") > 50),
        col("event_type").isin(["play", "click"]) & ~(col("n") >= 2),
        col("price").log1p(),
        col("title").str_len() * 2 + col("n"),
        col("n") / 4,
        col("price").fill_null(-1.0),
        col("event_type").is_null(),
    ]
    con = duckdb.connect()
    con.register("t", frame.to_arrow())
    for expr in exprs:
        expected = frame.select(expr.to_polars().alias("v")).get_column("v").to_list()
        sql = expr.to_sql().replace("`", '"')  # DuckDB quotes identifiers the standard way
        got = [r[0] for r in con.execute(f"SELECT {sql} AS v FROM t").fetchall()]
        assert got == pytest.approx(expected, nan_ok=True), repr(expr)


def test_table_views_transform_rows():
    from feature_defs.compile.polars import build_table_rows

    view = catalogue.view("item_content")
    ts = datetime(2026, 1, 1, 10, tzinfo=UTC)
    changes = pl.DataFrame({c: [None] for c in items.columns}, schema={c: _pl(t) for c, t in items.schema.items()})
    changes = changes.with_columns(
        item_id=pl.lit(5, pl.Int64), price=pl.lit(9.0), title=pl.lit("Red car"), updated_at=pl.lit(ts)
    )
    row = build_table_rows(view, changes.lazy()).collect().row(0, named=True)
    assert row["item_id"] == 5 and row["event_timestamp"] == ts and row["title_length"] == 7
    assert row["log_price"] == pytest.approx(2.302585, rel=1e-5)
    assert date(2026, 1, 1) == row["event_timestamp"].date()

    geometry = catalogue.view("item_geometry")
    measured = pl.DataFrame(
        {c: [None, None] for c in item_geometry.columns}, schema={c: _pl(t) for c, t in item_geometry.schema.items()}
    )
    measured = measured.with_columns(
        item_id=pl.Series([6, 7]),
        updated_at=pl.lit(ts),
        bbox_x=pl.Series([2.0, None]),
        bbox_y=pl.lit(3.0),
        bbox_z=pl.lit(4.0),
        mesh_error=pl.Series([None, "empty mesh: no faces"]),
    )
    rows = build_table_rows(geometry, measured.lazy()).collect().rows(named=True)
    assert rows[0]["bbox_volume"] == 24.0 and rows[0]["is_broken"] is False
    assert rows[1]["bbox_volume"] is None and rows[1]["is_broken"] is True


def _pl(t):
    from feature_defs.compile.polars import POLARS_TYPES

    return POLARS_TYPES[t]


def test_running_aggregations_restart_at_each_period_while_trailing_windows_slide():
    from feature_defs.compile.polars import build_rows_at

    view = FeatureView(
        "today",
        [user],
        interactions,
        [
            Feature("clicks_today", count("1d", running=True)),
            Feature("clicks_24h", count("1d")),
            Feature("spend_today", sum_("amount", "1d", running=True)),
        ],
    )
    at = [
        datetime(2026, 1, 1, 22, tzinfo=UTC),
        datetime(2026, 1, 2, 1, tzinfo=UTC),
        datetime(2026, 1, 2, 3, tzinfo=UTC),
    ]
    events = pl.DataFrame(
        {"user_id": [1, 1, 1], "event_timestamp": at, "amount": [1.0, 2.0, 4.0]},
        schema_overrides={"event_timestamp": pl.Datetime("us", "UTC")},
    )
    value_at = {}
    for end in (
        datetime(2026, 1, 2, tzinfo=UTC),
        datetime(2026, 1, 2, 2, tzinfo=UTC),
        datetime(2026, 1, 2, 3, tzinfo=UTC),
        datetime(2026, 1, 3, tzinfo=UTC),
    ):
        row = build_rows_at(view, events.lazy(), end).collect().row(0, named=True)
        value_at[end.strftime("%d %H")] = (row["clicks_today"], row["clicks_24h"], row["spend_today"])
    # midnight closes the first day's period; the second day's count starts from zero; an event at
    # exactly the end of a window is not in it
    assert value_at == {"02 00": (1, 1, 1.0), "02 02": (1, 2, 2.0), "02 03": (1, 2, 2.0), "03 00": (2, 2, 6.0)}
    spec = view.features[0].spec
    assert spec.start(datetime(2026, 1, 2, tzinfo=UTC)) == datetime(2026, 1, 1, tzinfo=UTC)
    assert spec.start(datetime(2026, 1, 2, 0, 0, 1, tzinfo=UTC)) == datetime(2026, 1, 2, tzinfo=UTC)
