import hashlib
import json
import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from simulator import MALFORMED_KINDS, Simulator, SimulatorConfig, simulate

START = date(2026, 1, 1)
DAYS = [START + timedelta(days=k) for k in range(3)]
SMALL = SimulatorConfig(
    seed=11,
    start_date=START,
    n_users=400,
    n_creators=40,
    n_items=300,
    n_reference_items=6,
    new_users_per_day=5,
    new_items_per_day=10,
)

TS = "timestamp[us, tz=UTC]"
# Transcribed from docs/landing-format.md (deliberately not imported from the simulator).
CONTRACT = {
    "interactions": [
        ("event_id", "string"),
        ("event_timestamp", TS),
        ("user_id", "int64"),
        ("item_id", "int64"),
        ("event_type", "string"),
        ("session_id", "string"),
        ("device", "string"),
        ("play_seconds", "double"),
        ("amount", "double"),
    ],
    "chat_messages": [
        ("message_id", "string"),
        ("event_timestamp", TS),
        ("sender_id", "int64"),
        ("receiver_id", "int64"),
        ("item_id", "int64"),
        ("text", "string"),
    ],
    "abuse_reports": [
        ("report_id", "string"),
        ("event_timestamp", TS),
        ("reporter_id", "int64"),
        ("reported_user_id", "int64"),
        ("item_id", "int64"),
        ("reason", "string"),
    ],
    "items": [
        ("item_id", "int64"),
        ("creator_id", "int64"),
        ("category", "string"),
        ("title", "string"),
        ("description", "string"),
        ("price", "double"),
        ("thumbnail_path", "string"),
        ("mesh_path", "string"),
        ("created_at", TS),
        ("updated_at", TS),
    ],
    "users": [
        ("user_id", "int64"),
        ("country", "string"),
        ("region", "string"),
        ("age_bucket", "string"),
        ("is_creator", "bool"),
        ("signup_at", TS),
        ("updated_at", TS),
    ],
    "creators": [
        ("creator_id", "int64"),
        ("user_id", "int64"),
        ("display_name", "string"),
        ("joined_at", TS),
        ("updated_at", TS),
    ],
}
EVENT_STREAMS = ["interactions", "chat_messages", "abuse_reports"]


def folder(root: Path, stream: str, day: date) -> Path:
    return root / "landing" / stream / f"date={day:%Y-%m-%d}"


def read(root: Path, stream: str, day: date, name: str = "part-0000.parquet") -> pd.DataFrame:
    return pq.read_table(folder(root, stream, day) / name).to_pandas()


def read_all(root: Path, stream: str) -> pd.DataFrame:
    return pd.concat([read(root, stream, day) for day in DAYS], ignore_index=True)


def truth(root: Path, name: str) -> pd.DataFrame:
    return pd.concat(
        [pq.read_table(p).to_pandas() for p in sorted((root / "sim_truth" / name).glob("*/*.parquet"))],
        ignore_index=True,
    )


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def thumbnail(root: Path, item_id: int) -> np.ndarray:
    return np.asarray(Image.open(root / "landing" / "thumbnails" / f"{item_id}.png"), dtype=float)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    Simulator(SMALL, root).run(3)
    return root


@pytest.fixture(scope="module")
def interactions(run_dir) -> pd.DataFrame:
    return read_all(run_dir, "interactions")


@pytest.fixture(scope="module")
def items(run_dir) -> pd.DataFrame:
    """The latest version of every item."""
    return read_all(run_dir, "items").sort_values("updated_at").drop_duplicates("item_id", keep="last")


def test_same_seed_gives_byte_identical_files(run_dir, tmp_path):
    Simulator(SMALL, tmp_path).run(3)
    assert digests(tmp_path) == digests(run_dir)


def test_other_seed_gives_other_data(run_dir, tmp_path):
    Simulator(SimulatorConfig(**{**SMALL.__dict__, "seed": 12}), tmp_path).write_day(START)
    assert not read(tmp_path, "interactions", START).equals(read(run_dir, "interactions", START))


def test_a_day_written_alone_equals_that_day_of_a_run(run_dir, tmp_path):
    Simulator(SMALL, tmp_path).write_day(DAYS[2])
    alone = digests(tmp_path)
    assert any("thumbnails" in path for path in alone)
    assert any("sim_truth/chat/date=2026-01-03" in path for path in alone)
    assert alone == {path: digest for path, digest in digests(run_dir).items() if path in alone}


@pytest.mark.parametrize("stream", CONTRACT)
def test_schema_matches_contract(run_dir, stream):
    for day in DAYS:
        schema = pq.read_schema(folder(run_dir, stream, day) / "part-0000.parquet")
        assert [(f.name, str(f.type)) for f in schema] == CONTRACT[stream]


def test_jsonl_holds_the_same_rows_as_parquet(run_dir, tmp_path):
    Simulator(SimulatorConfig(**{**SMALL.__dict__, "file_format": "jsonl"}), tmp_path).write_day(START)
    iso_z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
    for stream, columns in CONTRACT.items():
        lines = (folder(tmp_path, stream, START) / "part-0000.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert all(list(row) == [name for name, _ in columns] for row in rows)
        frame = pd.DataFrame(rows)
        for name, kind in columns:
            if kind == TS:
                assert frame[name].map(iso_z.match).all()
                frame[name] = pd.to_datetime(frame[name], utc=True).astype("datetime64[us, UTC]")
        expected = read(run_dir, stream, START)
        pd.testing.assert_frame_equal(frame, expected, check_dtype=False)


@pytest.mark.parametrize("stream", EVENT_STREAMS)
def test_events_lie_inside_their_day(run_dir, stream):
    for day in DAYS:
        ts = read(run_dir, stream, day).event_timestamp
        start = pd.Timestamp(day, tz="UTC")
        assert len(ts) > 0
        assert ts.min() >= start and ts.max() < start + pd.Timedelta(days=1)


def test_ids_are_unique(run_dir, interactions):
    assert interactions.event_id.is_unique
    assert read_all(run_dir, "chat_messages").message_id.is_unique
    assert read_all(run_dir, "abuse_reports").report_id.is_unique


def test_every_funnel_step_follows_the_previous_one(interactions):
    key = ["user_id", "item_id", "session_id"]
    for step, previous in [("click", "impression"), ("play", "click"), ("purchase", "play")]:
        later = interactions[interactions.event_type == step]
        earlier = interactions[interactions.event_type == previous][key + ["event_timestamp"]]
        pairs = later.merge(earlier, on=key, suffixes=("", "_before"))
        preceded = pairs[pairs.event_timestamp_before < pairs.event_timestamp].event_id.unique()
        assert len(later) > 0 and len(preceded) == len(later), step
    is_play, is_purchase = interactions.event_type == "play", interactions.event_type == "purchase"
    assert (interactions.play_seconds[is_play] > 0).all() and interactions.play_seconds[~is_play].isna().all()
    assert (interactions.amount[is_purchase] > 0).all() and interactions.amount[~is_purchase].isna().all()


def test_funnel_rates(interactions):
    counts = interactions.event_type.value_counts()
    assert 0.05 < counts["click"] / counts["impression"] < 0.15
    assert counts["click"] > counts["play"] > counts["purchase"] > 0


def test_only_existing_items_and_users_are_active(run_dir, interactions, items):
    created = interactions.item_id.map(items.set_index("item_id").created_at)
    assert (created <= interactions.event_timestamp).all()
    users = read_all(run_dir, "users").drop_duplicates("user_id").set_index("user_id")
    assert (interactions.user_id.map(users.signup_at) < interactions.event_timestamp).all()
    shown_new = interactions.item_id.isin(items.item_id[items.created_at >= pd.Timestamp(START, tz="UTC")])
    assert shown_new.any()  # items created during the run do get shown


def test_popularity_is_skewed(interactions):
    shown = interactions[interactions.event_type == "impression"].item_id.value_counts()
    top = shown.iloc[: len(shown) // 10].sum()
    assert top / shown.sum() > 0.4


def test_users_click_their_clusters_preferred_categories_more(run_dir, interactions, items):
    clusters = truth(run_dir, "users").set_index("user_id").taste_cluster
    affinity = pq.read_table(run_dir / "sim_truth" / "taste_clusters.parquet").to_pandas()
    preferred = set(map(tuple, affinity[affinity.affinity > 1][["taste_cluster", "category"]].to_numpy()))
    events = interactions.assign(
        cluster=interactions.user_id.map(clusters),
        category=interactions.item_id.map(items.set_index("item_id").category),
    )
    events["preferred"] = [(c, k) in preferred for c, k in zip(events.cluster, events.category)]
    counts = events.groupby(["preferred", "event_type"]).size().unstack()
    ctr = counts["click"] / counts["impression"]
    assert ctr[True] > 2 * ctr[False]


def test_dimension_files_hold_the_initial_world_then_changes(run_dir, items):
    day0, day1 = read(run_dir, "items", DAYS[0]), read(run_dir, "items", DAYS[1])
    assert len(day0) == SMALL.n_items + SMALL.new_items_per_day
    assert len(read(run_dir, "users", DAYS[0])) == SMALL.n_users + SMALL.new_users_per_day
    assert len(read(run_dir, "creators", DAYS[0])) == SMALL.n_creators + SMALL.new_creators_per_day
    day1_start = pd.Timestamp(DAYS[1], tz="UTC")
    new = day1[day1.created_at >= day1_start]
    changed = day1[day1.created_at < day1_start]
    assert len(new) == SMALL.new_items_per_day and len(changed) > 0
    assert (changed.updated_at >= day1_start).all()
    old_price = changed.item_id.map(day0.set_index("item_id").price)
    assert (changed.price != old_price).any()
    promoted = read(run_dir, "users", DAYS[1]).query("signup_at < @day1_start")
    assert promoted.is_creator.all() and len(promoted) > 0
    for path in items.thumbnail_path:
        assert (run_dir / "landing" / path).exists()


def test_violating_items_are_near_copies_of_their_reference(run_dir, items):
    answers = truth(run_dir, "items")
    references = set(pq.read_table(run_dir / "sim_truth" / "reference_items.parquet").column("item_id").to_pylist())
    assert references == set(answers.item_id[answers.is_reference])
    variants = answers[answers.is_violation]
    assert len(variants) >= round(SMALL.violation_fraction * SMALL.n_items)
    clean = items[~items.item_id.isin(answers.item_id[answers.is_violation | answers.is_reference])]
    by_id = items.set_index("item_id")
    rng = np.random.default_rng(0)
    for variant, reference in zip(variants.item_id, variants.reference_item_id.astype(int)):
        assert reference in references
        assert by_id.category[variant] == by_id.category[reference]
        assert by_id.creator_id[variant] != by_id.creator_id[reference]
        assert by_id.title[variant] != by_id.title[reference]
        image = thumbnail(run_dir, variant)
        peers = rng.choice(clean.item_id[clean.category == by_id.category[variant]].to_numpy(), 5, replace=False)
        nearest_peer = min(((image - thumbnail(run_dir, p)) ** 2).mean() for p in peers)
        assert ((image - thumbnail(run_dir, reference)) ** 2).mean() < 0.7 * nearest_peer


def test_abusers_write_abuse_and_get_reported(run_dir):
    abusers = set(truth(run_dir, "users").query("is_abuser").user_id)
    chat = read_all(run_dir, "chat_messages").merge(truth(run_dir, "chat"), on="message_id")
    from_abusers = chat.sender_id.isin(abusers)
    assert chat.is_abusive[from_abusers].mean() > 0.4 > 0.02 > chat.is_abusive[~from_abusers].mean()
    reports = read_all(run_dir, "abuse_reports")
    assert set(reports.reason) <= {"spam", "harassment", "scam", "ip_violation", "inappropriate"}
    assert reports.reported_user_id.isin(abusers).mean() > 5 * len(abusers) / SMALL.n_users
    ip = reports[reports.reason == "ip_violation"]
    violating = truth(run_dir, "items").query("is_violation").item_id
    assert ip.item_id.notna().all() and ip.item_id.isin(violating).mean() > 0.2


@pytest.fixture(scope="module")
def faults_dir(tmp_path_factory) -> tuple[Simulator, Path]:
    """A separate data dir that the fault tests add files to (each checks the others stay intact)."""
    root = tmp_path_factory.mktemp("faults")
    sim = Simulator(SMALL, root)
    sim.run(2)
    return sim, root


@pytest.mark.parametrize("stream", EVENT_STREAMS)
@pytest.mark.parametrize("kind", MALFORMED_KINDS)
def test_malformed_file_is_malformed_and_leaves_the_rest_intact(faults_dir, kind, stream):
    sim, root = faults_dir
    before = digests(root)
    path = sim.write_malformed_file(DAYS[1], stream=stream, kind=kind)
    assert path.parent == folder(root, stream, DAYS[1]) and path.name.startswith("malformed-")
    assert {p: d for p, d in digests(root).items() if p != str(path.relative_to(root))} == before
    names = [name for name, _ in CONTRACT[stream]]
    if kind == "bad_json":
        lines = path.read_text().splitlines()
        broken = 0
        for line in lines:
            try:
                json.loads(line)
            except json.JSONDecodeError:
                broken += 1
        assert len(lines) > 1 and broken == 1
        return
    table = pq.read_table(path)
    user_column = names[2]
    if kind == "missing_column":
        assert table.column_names == [n for n in names if n != user_column]
    elif kind == "wrong_type":
        assert table.column_names == names and table.schema.field(user_column).type == pa.string()
    else:
        start = datetime(DAYS[1].year, DAYS[1].month, DAYS[1].day, tzinfo=UTC)
        ts = table.column("event_timestamp").to_pylist()
        assert table.num_rows > 0 and all(not start <= t < start + timedelta(days=1) for t in ts)


@pytest.mark.parametrize("stream", ["interactions", "chat_messages"])
def test_duplicate_file_repeats_the_same_ids(faults_dir, stream):
    sim, root = faults_dir
    path = sim.write_duplicate_file(DAYS[1], stream)
    original = read(root, stream, DAYS[1])
    assert path.name != "part-0000.parquet"
    assert pq.read_table(path).to_pandas().equals(original)


@pytest.mark.parametrize("stream", EVENT_STREAMS)
def test_late_file_adds_new_events_inside_the_earlier_day(faults_dir, stream):
    sim, root = faults_dir
    path = sim.write_late_file(DAYS[0], stream)
    late, main = pq.read_table(path).to_pandas(), read(root, stream, DAYS[0])
    id_column = CONTRACT[stream][0][0]
    assert late.columns.tolist() == main.columns.tolist()
    assert late[id_column].is_unique and not set(late[id_column]) & set(main[id_column])
    start = pd.Timestamp(DAYS[0], tz="UTC")
    assert (late.event_timestamp >= start).all() and (late.event_timestamp < start + pd.Timedelta(days=1)).all()
    if stream == "interactions":
        assert 0 < len(late) < len(main)
    if stream == "chat_messages":
        late_truth = pq.read_table(root / "sim_truth" / "chat" / "date=2026-01-01" / "late-0001.parquet")
        assert set(late_truth.column("message_id").to_pylist()) == set(late.message_id)


def test_simulate_summary_matches_files(tmp_path):
    summary = simulate(tmp_path, days=2, seed=5, start_date=START, scale=0.1)
    assert summary["dates"] == ["2026-01-01", "2026-01-02"]
    day = summary["days"][1]
    for stream, count in day["rows"].items():
        assert pq.read_metadata(day["files"][stream]).num_rows == count
    assert not list(tmp_path.rglob(".*.tmp"))  # atomic writes leave no temp files behind
