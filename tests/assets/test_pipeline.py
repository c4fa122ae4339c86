"""The daily pipeline end to end on simulated landing files, checked against independent
computations done here in plain Python straight from the landing files."""

from __future__ import annotations

import random
import shutil
from collections import defaultdict
from datetime import UTC, datetime, time, timedelta

import polars as pl
import pyarrow.parquet as pq
import pytest
from dagster import AssetSelection
from polars.testing import assert_frame_equal

from engines.data.lake import Lake
from engines.features.datasets import LABEL_HORIZON, labelled_impressions
from jobs import daily_assets
from orchestration.profiles import resources_for
from tests.conftest import FIRST_DAY, LAST_DAY, run_pipeline
from tests.engines.test_training_labels import plain_labels

END = datetime.combine(LAST_DAY + timedelta(days=1), time(), tzinfo=UTC)
START = datetime.combine(FIRST_DAY, time(), tzinfo=UTC)


def landing_events(data_dir) -> list[dict]:
    """Every interaction in the landing files, read with pyarrow alone."""
    rows = []
    for path in sorted((data_dir / "landing" / "interactions").glob("date=*/*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def expected_user_features(events: list[dict], user_id: int, end: datetime) -> dict:
    def within(e, days):
        return end - timedelta(days=days) <= e["event_timestamp"] < end

    mine = [e for e in events if e["user_id"] == user_id]
    clicks7 = [e for e in mine if e["event_type"] == "click" and within(e, 7)]
    clicks30 = sorted(
        (e for e in mine if e["event_type"] == "click" and within(e, 30)),
        key=lambda e: (e["event_timestamp"], e["item_id"]),
        reverse=True,
    )
    last = []
    for e in clicks30:
        if e["item_id"] not in last:
            last.append(e["item_id"])
    return {
        "impressions_7d": sum(1 for e in mine if e["event_type"] == "impression" and within(e, 7)),
        "clicks_7d": len(clicks7),
        "distinct_items_clicked_7d": len({e["item_id"] for e in clicks7}),
        "spend_30d": sum(e["amount"] for e in mine if e["event_type"] == "purchase" and within(e, 30)),
        "last_clicked_items": last[:10],
    }


@pytest.fixture(scope="module")
def lake_copy(pipeline_dir, tmp_path_factory):
    """The pipeline's lake, copied: two tests here run the pipeline again over it, and the shared lake
    is read by other workers meanwhile."""
    return shutil.copytree(pipeline_dir, tmp_path_factory.mktemp("pipeline") / "lake")


@pytest.fixture(scope="module")
def events(lake_copy):
    """The interactions of the days the pipeline ran over (the next day is landed for the labels only)."""
    return [e for e in landing_events(lake_copy) if e["event_timestamp"] < END]


@pytest.fixture(scope="module")
def store(lake_copy):
    return resources_for("local", data_dir=str(lake_copy))["feature_store"].get_client()


def sample_users(events, n=25, seed=0):
    clickers = sorted({e["user_id"] for e in events if e["event_type"] == "click"})
    return random.Random(seed).sample(clickers, n)


def test_offline_and_online_features_equal_independent_computation(lake_copy, events, store):
    offline = Lake(lake_copy).read_partition("offline", "user_engagement", LAST_DAY)
    assert offline.get_column("event_timestamp").unique().to_list() == [END]
    users = sample_users(events)
    online = store.online_features("personalization_ranking", [{"user_id": u, "item_id": 0} for u in users])
    for i, user in enumerate(users):
        want = expected_user_features(events, user, END)
        got = offline.filter(pl.col("user_id") == user).row(0, named=True)
        for name, value in want.items():
            assert got[name] == pytest.approx(value), (user, name)
            assert online[f"user_engagement__{name}"][i] == pytest.approx(value), (user, name, "online")


def test_item_and_chat_features_equal_independent_computation(lake_copy, events):
    lake = Lake(lake_copy)
    items = lake.read_partition("offline", "item_popularity", LAST_DAY)
    week = [e for e in events if END - timedelta(days=7) <= e["event_timestamp"] < END]
    for item in random.Random(4).sample(sorted({e["item_id"] for e in week}), 25):
        mine = [e for e in week if e["item_id"] == item]
        shown = sum(1 for e in mine if e["event_type"] == "impression")
        clicks = sum(1 for e in mine if e["event_type"] == "click")
        row = items.filter(pl.col("item_id") == item).row(0, named=True)
        assert row["distinct_users_7d"] == len({e["user_id"] for e in mine}), item
        assert row["ctr_7d"] == (pytest.approx(clicks / shown) if shown else None), item

    chat = []
    for path in sorted((lake_copy / "landing" / "chat_messages").glob("date=*/*.parquet")):
        chat += pq.read_table(path).to_pylist()
    day = [m for m in chat if END - timedelta(days=1) <= m["event_timestamp"] < END]
    senders = lake.read_partition("offline", "user_chat", LAST_DAY)
    for sender in sorted({m["sender_id"] for m in day})[:25]:
        row = senders.filter(pl.col("user_id") == sender).row(0, named=True)
        mine = [m for m in day if m["sender_id"] == sender]
        assert row["messages_sent_1d"] == len(mine)
        assert row["distinct_receivers_1d"] == len({m["receiver_id"] for m in mine})


def test_inactive_entities_get_zero_rows_not_stale_values(lake_copy, events):
    """A user seen on day 1 only still has a row on day 3, with 1-day counts back at zero."""
    day1_users = {e["user_id"] for e in events if e["event_timestamp"].date() == FIRST_DAY}
    later = {e["user_id"] for e in events if e["event_timestamp"].date() > FIRST_DAY}
    quiet = sorted(day1_users - later)
    assert quiet, "the simulation should have users who were active on the first day only"
    chat = Lake(lake_copy).read_partition("offline", "user_activity_realtime", LAST_DAY)
    rows = Lake(lake_copy).read_partition("offline", "user_engagement", LAST_DAY)
    assert rows.filter(pl.col("user_id").is_in(quiet)).height == len(quiet)
    assert chat.filter(pl.col("user_id").is_in(quiet)).height == 0  # 1h window plus one day has passed


def test_training_rows_never_see_the_future(lake_copy, events):
    training = pl.read_parquet(lake_copy / "datasets" / "personalization_training" / "date=*/*.parquet")
    assert training.height == sum(1 for e in events if e["event_type"] == "impression" and e["event_timestamp"] < END)
    assert training.get_column("event_id").n_unique() == training.height

    first_day = training.filter(pl.col("event_timestamp").dt.date() == FIRST_DAY)
    assert first_day.get_column("user_engagement__clicks_7d").null_count() == first_day.height

    clicks_by_user = defaultdict(list)
    for e in events:
        if e["event_type"] == "click":
            clicks_by_user[e["user_id"]].append(e["event_timestamp"])
    last_day = training.filter(pl.col("event_timestamp").dt.date() == LAST_DAY)
    leaky_would_differ = 0
    for row in last_day.sample(400, seed=1).iter_rows(named=True):
        at = row["event_timestamp"]
        day_start = datetime.combine(at.date(), time(), tzinfo=UTC)
        clicks = clicks_by_user[row["user_id"]]
        as_of_day_start = sum(1 for t in clicks if day_start - timedelta(days=7) <= t < day_start)
        up_to_label = sum(1 for t in clicks if at - timedelta(days=7) <= t <= at)
        feature = row["user_engagement__clicks_7d"] or 0
        assert feature == as_of_day_start, row["event_id"]
        leaky_would_differ += up_to_label != as_of_day_start
    assert leaky_would_differ > 0, "the sample must contain rows where a leak would show"


def test_labels_come_from_later_clicks_in_the_session(lake_copy):
    """A click labels the impression of that item before it, within the label horizon, whose session it
    echoes, else the last (tests/engines/test_training_labels.py recomputes the rule plainly); the last
    day's late impressions are labelled by clicks after midnight."""
    events = landing_events(lake_copy)
    training = pl.read_parquet(lake_copy / "datasets" / "personalization_training" / "date=*/*.parquet")
    expected = {event: clicked for event, (clicked, _) in plain_labels(events, LABEL_HORIZON, START, END).items()}
    got = dict(training.select("event_id", "label_click").iter_rows())
    assert got == expected
    assert 0.01 < training.get_column("label_click").mean() < 0.5


def test_impressions_without_a_session_are_dropped_and_counted():
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    rows = pl.DataFrame(
        {
            "event_id": ["a", "b", "c"],
            "user_id": [1, 1, 1],
            "item_id": [5, 5, 5],
            "event_type": ["impression", "impression", "click"],
            "session_id": [None, "s", "s"],
            "event_timestamp": [at, at, at + LABEL_HORIZON - timedelta(seconds=1)],
        }
    )
    labelled = labelled_impressions(rows)
    assert labelled.without_session == 1
    assert labelled.rows.select("event_id", "label_click").rows() == [("b", True)]
    # an impression at 23:50 is labelled by a click at 00:10 the next day, which the day's dataset waits for
    night = datetime(2026, 1, 1, 23, 50, tzinfo=UTC)
    day = rows.slice(1, 1).with_columns(pl.lit(night).cast(pl.Datetime("us", "UTC")).alias("event_timestamp"))
    next_day = rows.slice(2, 1).with_columns(
        pl.lit(night + timedelta(minutes=20)).cast(pl.Datetime("us", "UTC")).alias("event_timestamp")
    )
    assert labelled_impressions(day, next_day).rows["label_click"].to_list() == [True]
    assert labelled_impressions(day).rows["label_click"].to_list() == [False]
    late = rows.with_columns(pl.col("event_timestamp") + pl.Series([timedelta(0), timedelta(0), timedelta(seconds=2)]))
    assert labelled_impressions(late).rows["label_click"].to_list() == [False]  # a click past the horizon


def test_rerunning_a_partition_is_idempotent(lake_copy, events, store):
    lake = Lake(lake_copy)
    users = sample_users(events, n=10, seed=5)
    rows = [{"user_id": u, "item_id": 0} for u in users]
    before_online = store.online_features("personalization_ranking", rows)
    before = {
        name: lake.read_partition("offline", name, LAST_DAY)
        for name in ("user_engagement", "item_popularity", "user_item_affinity")
    }
    before_training = lake.read_partition("datasets", "personalization_training", LAST_DAY)

    run_pipeline(lake_copy, LAST_DAY, LAST_DAY, selection=daily_assets | AssetSelection.groups("datasets"))

    # Same rows and values; float sums may differ in the last bit with polars' parallel summation order.
    for name, frame in before.items():
        after = lake.read_partition("offline", name, LAST_DAY)
        assert_frame_equal(after, frame, rel_tol=1e-12, abs_tol=0)
        keys = [c for c in after.columns if c.endswith("_id")] + ["event_timestamp"]
        assert after.select(keys).is_duplicated().sum() == 0, name
    assert_frame_equal(
        lake.read_partition("datasets", "personalization_training", LAST_DAY), before_training, rel_tol=1e-12, abs_tol=0
    )
    after_online = store.online_features("personalization_ranking", rows)
    assert after_online.keys() == before_online.keys()
    for name, values in after_online.items():
        assert values == [pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for v in before_online[name]], name


def test_online_item_content_is_the_latest_catalogue_row(lake_copy, store):
    """Every item, from the first full catalogue delivery to today's price changes, is served online
    with its latest attributes, read straight from the landing files."""
    rows = []
    for path in sorted((lake_copy / "landing" / "items").glob("date=*/*.parquet")):
        if path.parent.name <= f"date={LAST_DAY.isoformat()}":  # the days the pipeline ran over
            rows += pq.read_table(path).to_pylist()
    latest = {}
    for row in sorted(rows, key=lambda r: r["updated_at"]):
        latest[row["item_id"]] = row
    changed = [r for r in rows if r["updated_at"] > r["created_at"]]
    assert changed, "the simulation should change some prices"
    items = sorted(random.Random(3).sample(sorted(latest), 40) + [r["item_id"] for r in changed[:10]])
    online = store.online_features("search", [{"item_id": i} for i in items])
    for n, item in enumerate(items):
        assert online["item_content__price"][n] == pytest.approx(latest[item]["price"]), item
        assert online["item_content__category"][n] == latest[item]["category"], item


def test_rerunning_an_old_day_keeps_the_newest_values_online(lake_copy, events, store):
    users = sample_users(events, n=10, seed=7)
    rows = [{"user_id": u, "item_id": 0} for u in users]
    newest = store.online_features("personalization_ranking", rows)
    run_pipeline(lake_copy, FIRST_DAY, FIRST_DAY)
    assert store.online_features("personalization_ranking", rows) == newest
    for i, user in enumerate(users):
        assert newest["user_engagement__clicks_7d"][i] == expected_user_features(events, user, END)["clicks_7d"]
