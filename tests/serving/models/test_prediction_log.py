"""The prediction log writer: records written asynchronously to partitioned Parquet, nothing lost on a
clean stop, while the log folder's disk is full, or when the process stops with the disk still full.

The full disk is injected: the lake writer raises OSError(ENOSPC) while `full` is set (the same error a
full filesystem gives), so the test runs without root to mount a tiny tmpfs. Everything else (Parquet,
rename, the spill folder) is the real filesystem."""

from __future__ import annotations

import errno
import json
import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from engines.experimentation.prediction_logs import LIVE, SPOOL, ZONE, PredictionRecord, read_spool, spool_days
from serving.models.hooks.prediction_log import PredictionLog, write_atomically
from serving.models.protocols.protocol import ProtocolError

START = datetime(2026, 3, 1, 23, 59, 58, tzinfo=UTC)  # records straddle midnight: two day partitions


def record(i: int) -> PredictionRecord:
    rng = random.Random(i)
    items = rng.sample(range(1000), 5)
    return PredictionRecord(
        request_id=f"r{i}",
        served_at=START + timedelta(milliseconds=7 * i),
        role=LIVE,
        endpoint="recommend",
        user_id=rng.randrange(100),
        experiment="exp",
        variant=rng.choice(["control", "treatment"]),
        assignments={"exp": "control"},
        served_model="personalization",
        registry_model="personalization",
        model_version="1",
        k=5,
        inputs_hash=f"{i:064x}",
        latency_ms=rng.random(),
        item_ids=items,
        scores=[rng.random() for _ in items],
    )


class FullDisk:
    """The lake's writer, refusing with ENOSPC while `full` is set."""

    def __init__(self):
        self.full = threading.Event()
        self.refused = 0

    def __call__(self, data: pl.DataFrame, path: Path) -> None:
        if self.full.is_set():
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write_atomically(data, path)


def logged(lake: Path) -> pl.DataFrame:
    return pl.concat([read_spool(lake, d) for d in spool_days(lake)]) if spool_days(lake) else pl.DataFrame()


def expected(n: int) -> pl.DataFrame:
    from engines.experimentation.prediction_logs import frame

    return frame([record(i) for i in range(n)]).sort("request_id")


def test_every_record_lands_in_its_day_partition_once(tmp_path):
    log = PredictionLog(tmp_path / "lake", tmp_path / "spill", flush_interval_s=0.05)
    writers = [
        threading.Thread(target=lambda lo=lo: [log.submit(record(i)) for i in range(lo, lo + 500)])
        for lo in range(0, 2000, 500)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    log.close()
    out = logged(tmp_path / "lake").sort("request_id")
    assert out.equals(expected(2000))  # every column as submitted, none twice
    for day in spool_days(tmp_path / "lake"):  # each partition holds its own day's records only
        assert set(read_spool(tmp_path / "lake", day)["served_at"].dt.date().to_list()) == {day}
    assert len(spool_days(tmp_path / "lake")) == 2


def test_a_full_disk_loses_nothing_and_the_backlog_drains_when_space_returns(tmp_path):
    disk = FullDisk()
    log = PredictionLog(tmp_path / "lake", tmp_path / "spill", flush_interval_s=60, write=disk)  # flushed here
    for i in range(300):
        log.submit(record(i))
    log.flush()
    disk.full.set()
    for i in range(300, 900):
        log.submit(record(i))
    assert not log.flush()  # refused: kept, and copied to the spill folder
    assert log.backlog == 600 and "No space left" in log.last_error and disk.refused
    spilled = pl.concat([pl.read_parquet(p) for p in (tmp_path / "spill").rglob("*.parquet")])
    assert sorted(spilled["request_id"]) == sorted(f"r{i}" for i in range(300, 900))
    disk.full.clear()
    for i in range(900, 1000):
        log.submit(record(i))
    log.close()
    assert logged(tmp_path / "lake").sort("request_id").equals(expected(1000))
    assert not list((tmp_path / "spill").rglob("*.parquet"))  # the spilled copies went once the lake had them


def test_a_stop_with_the_disk_still_full_leaves_the_records_spilled_for_the_next_start(tmp_path):
    disk = FullDisk()
    disk.full.set()
    log = PredictionLog(tmp_path / "lake", tmp_path / "spill", flush_interval_s=0.02, write=disk)
    for i in range(400):
        log.submit(record(i))
    log.close()
    assert not (tmp_path / "lake" / ZONE / SPOOL).exists() or logged(tmp_path / "lake").is_empty()
    disk.full.clear()
    restarted = PredictionLog(tmp_path / "lake", tmp_path / "spill", flush_interval_s=0.02, write=disk)
    restarted.submit(record(400))
    restarted.close()
    assert logged(tmp_path / "lake").sort("request_id").equals(expected(401))


def test_past_the_backlog_limit_answers_are_refused_not_left_unlogged(tmp_path):
    disk = FullDisk()
    disk.full.set()
    log = PredictionLog(tmp_path / "lake", tmp_path / "spill", flush_interval_s=60, max_backlog=50, write=disk)
    for i in range(50):
        log.submit(record(i))
    with pytest.raises(ProtocolError) as refused:
        log.submit(record(50))
    assert refused.value.status == 503 and "backlog" in refused.value.message
    disk.full.clear()
    log.close()
    assert logged(tmp_path / "lake").sort("request_id").equals(expected(50))


def test_an_infer_call_is_logged_with_the_hash_of_its_tensors_and_its_outputs(tower_server):
    """Through the running server: the record's inputs hash is recomputed from the request's tensors as the
    server decoded them, and its outputs are the response's."""
    import httpx
    import numpy as np
    import tritonclient.http as triton

    from engines.experimentation.prediction_logs import tensors_hash
    from serving.models.protocols.binary import decode_inputs
    from serving.models.protocols.protocol import InferenceRequest
    from tests.serving.models.test_protocol import valid_body

    body = {
        **valid_body(triton.InferenceServerClient(tower_server.url.removeprefix("http://"))),
        "parameters": {"request_id": "infer-logged-1", "user_id": 7},
    }
    answer = httpx.post(f"{tower_server.url}/v2/models/personalization/infer", json=body)
    assert answer.status_code == 200, answer.text
    tower_server.server.prediction_log.flush()
    lake = tower_server.server.config.lake_path()
    logged = (
        pl.concat([read_spool(lake, d) for d in spool_days(lake)])
        .filter(pl.col("request_id") == "infer-logged-1")
        .row(0, named=True)
    )
    expected_hash = tensors_hash(decode_inputs(InferenceRequest.model_validate(body), b""))
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    logged_outputs = json.loads(logged["outputs"])
    assert (logged["endpoint"], logged["user_id"], logged["model_version"]) == ("personalization", 7, "1")
    assert logged["inputs_hash"] == expected_hash and logged["inputs"] is None  # no card consent
    for name, data in outputs.items():
        np.testing.assert_allclose(np.asarray(logged_outputs[name]).reshape(-1), data, rtol=1e-6)


def test_a_record_that_cannot_be_written_is_quarantined_alone_and_the_others_are_written(tmp_path):
    import dataclasses

    lake = tmp_path / "lake"
    log = PredictionLog(lake, tmp_path / "spill", flush_interval_s=0.05)
    poison = {
        "huge-user": dataclasses.replace(record(20), request_id="huge-user", user_id=2**70),  # seen at submit
        "bad-score": dataclasses.replace(record(21), request_id="bad-score", scores=["NaN?"] * 5),
        "bad-hash": dataclasses.replace(record(22), request_id="bad-hash", inputs_hash=b"\x00"),  # at flush
    }
    for i in range(50):
        log.submit(record(i))
        if i == 20:
            for bad in poison.values():
                log.submit(bad)
    log.close()
    written = logged(lake).sort("request_id")
    assert written.equals(expected(50)), "every good record is written, once"
    lines = [
        json.loads(line) for f in (lake / ZONE / "prediction_log_quarantine").rglob("*.jsonl") for line in f.open()
    ]
    reasons = {line["record"]["request_id"]: line["reason"] for line in lines}
    assert set(reasons) == set(poison) and "user_id" in reasons["huge-user"], reasons
    assert log.quarantined == 3 and not list((tmp_path / "spill").rglob("*.parquet"))


def test_each_record_names_its_experiments_file_and_the_file_survives_a_full_disk_and_a_restart(tmp_path):
    """The file a record was routed with is stored under its digest before the records naming it; while
    the lake refuses, it is spilled with them, and the next start stores both."""
    import dataclasses

    from engines.experimentation.prediction_logs import config_digest, read_config

    files = [b"experiments: []\n", b"experiments: []\n# changed\n"]
    digests = [config_digest(f) for f in files]
    named = [dataclasses.replace(record(i), experiments_config=digests[i % 2]) for i in range(200)]
    disk = FullDisk()
    log = PredictionLog(tmp_path / "lake", tmp_path / "spill", flush_interval_s=60, write=disk)
    log.keep_config(digests[0], files[0])
    for r in named[:100:2]:
        log.submit(r)
    assert log.flush() and read_config(tmp_path / "lake", digests[0]) == files[0]
    disk.full.set()
    log.keep_config(digests[1], files[1])
    for r in named[100:] + named[1:100:2]:
        log.submit(r)
    assert not log.flush()
    with pytest.raises(FileNotFoundError, match=digests[1]):
        read_config(tmp_path / "lake", digests[1])
    log.close()  # still full: the records and the new file stay in the spill folder
    disk.full.clear()
    PredictionLog(tmp_path / "lake", tmp_path / "spill", flush_interval_s=60, write=disk).close()
    assert [read_config(tmp_path / "lake", d) for d in digests] == files
    out = logged(tmp_path / "lake").sort("request_id")
    assert out["experiments_config"].to_list() == [digests[int(r[1:]) % 2] for r in out["request_id"]]
    assert out.height == 200 and not list((tmp_path / "spill").rglob("*.*"))


def test_a_log_written_before_the_config_column_is_read_with_it_null(tmp_path):
    from engines.experimentation.prediction_logs import frame

    old = frame([record(i) for i in range(10)]).drop("experiments_config")
    day = START.date()
    write_atomically(old, tmp_path / ZONE / SPOOL / f"date={day}" / "part-1.parquet")
    read = read_spool(tmp_path, day)
    assert read.height == 10 and read["experiments_config"].null_count() == 10
    assert read.drop("experiments_config").equals(old.cast(read.drop("experiments_config").schema))
