from datetime import date

import polars as pl
import pyarrow.parquet as pq
import pytest

from engines.data.ingest import load_day, write_day
from engines.data.lake import Lake
from feature_defs.sources import interactions
from simulator import MALFORMED_KINDS, Simulator, SimulatorConfig

DAY = date(2026, 1, 1)
CONFIG = SimulatorConfig(seed=3, start_date=DAY).scaled(0.1)


@pytest.fixture()
def sim(tmp_path) -> Simulator:
    sim = Simulator(CONFIG, tmp_path)
    sim.write_day(DAY)
    return sim


def landing_rows(lake: Lake) -> int:
    return sum(pq.read_metadata(p).num_rows for p in lake.landing_files("interactions", DAY))


@pytest.mark.parametrize("kind", MALFORMED_KINDS)
def test_malformed_file_is_quarantined_whole_and_the_rest_loads(sim, tmp_path, kind):
    lake = Lake(tmp_path)
    good_rows = landing_rows(lake)
    bad = sim.write_malformed_file(DAY, "interactions", kind)
    frame, report = load_day(lake, interactions, DAY)

    assert frame.height == good_rows  # every good row, none of the bad file's
    assert not frame.get_column("event_id").str.contains("-bad-").any()
    assert list(report.quarantined) == [bad.name]
    problem = report.quarantined[bad.name]
    assert bad.name in problem
    expected = {
        "bad_json": "not valid JSON",
        "missing_column": "missing column(s) user_id",
        "wrong_type": "column 'user_id' cannot be read as int64",
        "out_of_day": "outside 2026-01-01",
    }[kind]
    assert expected in problem
    moved = lake.root / "quarantine" / "interactions" / "date=2026-01-01" / bad.name
    assert moved.exists() and not bad.exists()
    assert problem in moved.with_name(moved.name + ".error.txt").read_text()


def test_fixed_file_loads_on_rerun(sim, tmp_path):
    lake = Lake(tmp_path)
    bad = sim.write_malformed_file(DAY, "interactions", "wrong_type")
    first, _ = load_day(lake, interactions, DAY)
    write_day(lake, interactions, DAY, first)

    quarantined = pl.read_parquet(lake.quarantined_files("interactions", DAY)[0])
    fixed = quarantined.with_columns(pl.col("user_id").str.strip_prefix("user-").cast(pl.Int64))
    fixed.write_parquet(lake.landing_dir("interactions", DAY) / "fixed-wrong_type.parquet")
    second, report = load_day(lake, interactions, DAY)
    write_day(lake, interactions, DAY, second)

    assert report.quarantined == {}
    assert second.height == first.height + fixed.height
    assert set(fixed.get_column("event_id")) <= set(
        lake.read_partition("warehouse", "interactions", DAY).get_column("event_id")
    )
    assert bad.name not in report.files_loaded


def test_duplicate_and_rerun_are_idempotent(sim, tmp_path):
    lake = Lake(tmp_path)
    once, _ = load_day(lake, interactions, DAY)
    sim.write_duplicate_file(DAY, "interactions")
    twice, report = load_day(lake, interactions, DAY)
    assert report.duplicate_rows == once.height
    assert twice.equals(once)
    write_day(lake, interactions, DAY, once)
    write_day(lake, interactions, DAY, twice)
    assert lake.read_partition("warehouse", "interactions", DAY).equals(once)


def test_late_file_adds_rows(sim, tmp_path):
    lake = Lake(tmp_path)
    before, _ = load_day(lake, interactions, DAY)
    late = sim.write_late_file(DAY, "interactions")
    after, report = load_day(lake, interactions, DAY)
    assert late.name in report.files_loaded
    assert after.height == before.height + pq.read_metadata(late).num_rows


def test_missing_day_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no landing files for 'interactions' on 2026-01-05"):
        load_day(Lake(tmp_path), interactions, date(2026, 1, 5))


@pytest.mark.parametrize("stream", ["interactions", "chat_messages", "items"])
def test_jsonl_and_parquet_deliveries_load_to_the_same_rows(tmp_path, stream):
    from dataclasses import replace

    from feature_defs.sources import all_sources

    source = next(s for s in all_sources if s.name == stream)
    frames = []
    for fmt in ("parquet", "jsonl"):
        Simulator(replace(CONFIG, file_format=fmt), tmp_path / fmt).write_day(DAY)
        frame, report = load_day(Lake(tmp_path / fmt), source, DAY)
        assert report.quarantined == {} and frame.height > 0
        frames.append(frame)
    assert frames[0].equals(frames[1])


@pytest.mark.parametrize("correction_arrives", ["later", "earlier"])
def test_a_redelivered_event_resolves_to_the_newest_delivery_in_warehouse_and_staging(
    sim, tmp_path, correction_arrives
):
    """One rule for re-deliveries with different content: the newest delivery (arrival order) wins,
    in the warehouse and in the streaming backfill's staging. The correction moves the event earlier."""
    import json
    import os

    from engines.streaming import stage_landing

    lake = Lake(tmp_path)
    original = lake.landing_files("interactions", DAY)[0]
    event = pl.read_parquet(original).filter(pl.col("event_timestamp").dt.hour() >= 2).head(1)
    row = event.row(0, named=True)
    corrected = event.with_columns(pl.col("event_timestamp") - pl.duration(hours=1), pl.lit("console").alias("device"))
    assert corrected["event_timestamp"][0].date() == DAY
    path = lake.landing_dir("interactions", DAY) / "zz-correction.parquet"
    corrected.write_parquet(path)
    landed = original.stat().st_mtime_ns
    os.utime(path, ns=(landed + 10**9, landed + 10**9) if correction_arrives == "later" else (landed - 10**9,) * 2)
    want = corrected.row(0, named=True) if correction_arrives == "later" else row

    frame, report = load_day(lake, interactions, DAY)
    got = frame.filter(pl.col("event_id") == row["event_id"])
    assert got.height == 1 and report.duplicate_rows == 1
    assert (got["event_timestamp"][0], got["device"][0]) == (want["event_timestamp"], want["device"])

    staged = (
        [json.loads(line) for p in sorted((tmp_path / "staged").glob("*.jsonl")) for line in p.read_text().splitlines()]
        if stage_landing(lake, "interactions", [DAY], tmp_path / "staged", key="event_id")
        else []
    )
    mine = [r for r in staged if r["event_id"] == row["event_id"]]
    assert len(staged) == frame.height and len(mine) == 1
    assert (mine[0]["device"], mine[0]["event_timestamp"][:19]) == (
        want["device"],
        want["event_timestamp"].strftime("%Y-%m-%dT%H:%M:%S"),
    )
