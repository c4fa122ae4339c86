"""The prediction log writer: every answer (live and shadow) is queued in memory on the request path
(one append under a lock) and written by a background thread as Parquet into the lake's spool
(engines.experimentation.prediction_logs), one file per day per flush, atomically (temporary file, then rename).

Nothing admitted is dropped:
- a write that fails (the log folder's disk is full, the mount is gone) keeps the records queued and
  retries at the next flush; the records also go to a spill folder (another disk in production) so a
  crash while the lake is unwritable does not take them; spilled files move into the spool at the next
  write that succeeds, and at start;
- past `max_backlog` queued records the server stops admitting answers it could not log: the request
  gets a 503 naming the cause instead of an answer that would go unlogged;
- a clean stop writes what is queued (to the lake, else to the spill folder) and logs loudly, with the
  count, only if neither could take them.

The experiments file each record was routed with (`experiments_config`, a digest) is stored once in
the lake (engines.experimentation.prediction_logs.config_path) before the first file holding a record that names it, and
beside the spilled records while the lake refuses them: the analysis reads each experiment's control
and split from the file that was served (`keep_config` is told each file the server uses).

A record that can never be written (an id past int64, a value its column cannot hold) is not retried:
it is refused when the answer is made where that can be seen cheaply (`problem`), else found when its
day's frame is built, and kept alone with its reason in the quarantine folder
(`<lake>/serving/prediction_log_quarantine/date=D/*.jsonl`), so it never holds up the others.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import polars as pl

from engines.experimentation.prediction_logs import (
    CONFIGS,
    LIVE,
    OK,
    SPOOL,
    ZONE,
    PredictionRecord,
    canonical_json,
    config_path,
    frame,
    inputs_hash,
)
from serving.models.kinds.recommend import Answer
from serving.models.protocols.protocol import ProtocolError

RECOMMEND = "recommend"
QUARANTINE = "prediction_log_quarantine"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

log = logging.getLogger("mlplane.models")

Writer = Callable[[pl.DataFrame | bytes, Path], None]  # frame or file, final path: written whole or not at all


def write_atomically(data: pl.DataFrame | bytes, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            data.write_parquet(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class PredictionLog:
    def __init__(
        self,
        lake_root: Path,
        spill_dir: Path,
        flush_interval_s: float = 1.0,
        max_batch: int = 10_000,
        max_backlog: int = 500_000,
        write: Writer = write_atomically,
        on_state: Callable[[int, bool], None] | None = None,
    ):
        self.lake_root = Path(lake_root)
        self.spool = self.lake_root / ZONE / SPOOL
        self.quarantine = Path(lake_root) / ZONE / QUARANTINE
        self.quarantined = 0
        self.spill = Path(spill_dir)
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.max_backlog = max_backlog
        self.write = write
        self.on_state = on_state or (lambda backlog, failed: None)  # metrics: queued records, a write failed
        self.last_error = ""
        self._pending: list[PredictionRecord] = []
        self._configs: dict[str, bytes] = {}  # digest -> the experiments file's bytes, as the server used it
        self._stored: set[str] = set()  # digests whose file the lake has
        self._spilled: set[int] = set()  # ids of queued records that also have a copy in the spill folder
        self._mirrored: dict[date, list[Path]] = {}  # those copies' files, deleted once the lake has the day
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time (the thread and close)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prediction-log", daemon=True)
        self._thread.start()

    # --- the request path ------------------------------------------------------------------------
    def submit(self, record: PredictionRecord) -> None:
        reason = problem(record)
        if reason:
            self._quarantine([(record, reason)])
            return
        with self._lock:
            if len(self._pending) >= self.max_backlog:
                raise ProtocolError(
                    503,
                    f"prediction log backlog full ({len(self._pending)} records unwritten: "
                    f"{self.last_error or 'writer behind'}); not answering unlogged",
                )
            self._pending.append(record)
            if len(self._pending) >= self.max_batch:
                self._wake.set()

    def keep_config(self, digest: str, data: bytes) -> None:
        """An experiments file the server is about to route with: stored with the first records naming it."""
        with self._lock:
            self._configs[digest] = data

    @property
    def backlog(self) -> int:
        return len(self._pending)

    # --- the writer thread -----------------------------------------------------------------------
    def _run(self) -> None:
        with self._flush_lock:
            self._recover_spill()
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self.flush(quiet=True)

    def flush(self, quiet: bool = False) -> bool:
        """Write what is queued; False (the failed days' records kept, spilled where possible) when the
        lake refused."""
        with self._flush_lock:
            with self._lock:
                records, self._pending = self._pending, []
            failed: list[PredictionRecord] = []
            for day, part in _by_day(records).items():
                data, part = self._frame(part)
                try:
                    self._store_configs(part, self.lake_root / ZONE / CONFIGS, self.write, self._stored)
                    self.write(data, self._file(self.spool, day))
                except Exception as error:  # noqa: BLE001 - any failure keeps the records
                    self.last_error = f"{type(error).__name__}: {error}"
                    failed.extend(part)
                    continue
                self._spilled -= {id(r) for r in part}
                for path in self._mirrored.pop(day, []):  # spilled copies of records now in the lake
                    path.unlink(missing_ok=True)
            if failed:
                if not quiet:
                    log.warning("prediction log: writing %d records failed (%s); kept", len(failed), self.last_error)
                with self._lock:
                    self._pending = failed + self._pending
                self._spill(failed)
                self.on_state(len(self._pending), True)
                return False
            self.last_error = ""
            self._recover_spill()
            self.on_state(len(self._pending), False)
            return True

    def _frame(self, part: list[PredictionRecord]) -> tuple[pl.DataFrame, list[PredictionRecord]]:
        """The day's frame, without (quarantined) any record that cannot be one of its rows."""
        try:
            return frame(part), part
        except Exception:  # noqa: BLE001 - find the records at fault, one by one
            good, bad = [], []
            for record in part:
                try:
                    frame([record])
                    good.append(record)
                except Exception as error:  # noqa: BLE001 - whatever a record holds, it is kept aside
                    bad.append((record, f"{type(error).__name__}: {error}"))
            self._quarantine(bad)
            return frame(good), good

    def _quarantine(self, records: list[tuple[PredictionRecord, str]]) -> None:
        """Each record with its reason, one JSON line, in the quarantine folder; never retried."""
        for day, part in _by_day([r for r, _ in records]).items():
            reasons = dict((id(r), why) for r, why in records)
            lines = [json.dumps({"reason": reasons[id(r)], "record": _plain(r)}, default=repr) for r in part]
            path = self._file(self.quarantine, day).with_suffix(".jsonl")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("\n".join(lines) + "\n")
            except OSError as error:
                log.error("prediction log: %d records could not be quarantined (%s)", len(part), error)
        self.quarantined += len(records)
        for record, reason in records:
            log.warning("prediction log: record %s quarantined: %s", record.request_id, reason)

    def _store_configs(
        self, records: list[PredictionRecord], folder: Path, write: Writer, stored: set[str] | None = None
    ) -> None:
        """The experiments files the records name, written under `folder` where it lacks them (`stored`:
        the digests known to be there already, kept up to date)."""
        named = {r.experiments_config for r in records if r.experiments_config} - (stored or set())
        for digest in sorted(named):
            path = folder / f"{digest}.yaml"
            if not path.exists():
                if digest not in self._configs:  # the analysis will say which file is missing
                    log.error("prediction log: experiments config %s was never handed to the log", digest)
                    continue
                write(self._configs[digest], path)
            if stored is not None:
                stored.add(digest)

    def _file(self, root: Path, day: date) -> Path:
        return root / f"date={day.isoformat()}" / f"part-{time.time_ns()}-{os.getpid()}.parquet"

    def _spill(self, records: list[PredictionRecord]) -> None:
        """A copy on the spill disk of queued records, so a crash while the lake is unwritable loses none."""
        fresh = [r for r in records if id(r) not in self._spilled]
        for day, part in _by_day(fresh).items():
            path = self._file(self.spill, day)
            try:
                self._store_configs(part, self.spill / CONFIGS, write_atomically)
                write_atomically(frame(part), path)
            except Exception as error:  # noqa: BLE001 - the records stay queued in memory
                log.error(
                    "prediction log: the spill folder %s refused %d records too (%s: %s); kept in memory",
                    self.spill,
                    len(part),
                    type(error).__name__,
                    error,
                )
                continue
            self._spilled |= {id(r) for r in part}
            self._mirrored.setdefault(day, []).append(path)

    def _recover_spill(self) -> None:
        """Move files an earlier process spilled into the spool (one the spool has was moved before a crash)."""
        if not self.spill.is_dir():
            return
        mirrored = {p for paths in self._mirrored.values() for p in paths}
        for path in sorted((self.spill / CONFIGS).glob("*.yaml")):  # before the records that name them
            try:
                target = config_path(self.lake_root, path.stem)
                if not target.exists():
                    self.write(path.read_bytes(), target)
                path.unlink()
            except Exception as error:  # noqa: BLE001 - stays spilled until the next success
                self.last_error = f"{type(error).__name__}: {error}"
                return
        for path in sorted(self.spill.glob("date=*/part-*.parquet")):
            if path in mirrored:
                continue
            target = self.spool / path.parent.name / path.name
            try:
                if not target.exists():
                    self.write(pl.read_parquet(path), target)
                path.unlink()
            except Exception as error:  # noqa: BLE001 - stays spilled until the next success
                self.last_error = f"{type(error).__name__}: {error}"
                return

    def close(self) -> None:
        """Stop the thread and write everything queued: to the lake, else to the spill folder."""
        self._stop.set()
        self._wake.set()
        self._thread.join(60)
        if self.flush():
            return
        self._spill(self._pending)
        still = [r for r in self._pending if id(r) not in self._spilled]
        if still:
            log.critical(
                "prediction log: %d records could be written neither to %s nor to %s (%s)",
                len(still),
                self.spool,
                self.spill,
                self.last_error,
            )
        else:
            log.warning(
                "prediction log: %d records are in %s until the lake takes them (%s)",
                len(self._pending),
                self.spill,
                self.last_error,
            )


def problem(record: PredictionRecord) -> str:
    """Why a record cannot be a row of the log ("" when it can), checked when the answer is made."""
    for name in ("user_id", "k"):
        value = getattr(record, name)
        if value is not None and (not isinstance(value, int) or not INT64_MIN <= value <= INT64_MAX):
            return f"{name} {value!r} is not an int64"
    if not all(isinstance(i, int) and INT64_MIN <= i <= INT64_MAX for i in record.item_ids):
        return "item_ids hold a value that is not an int64"
    if not all(_is_number(v) for v in [record.latency_ms, *record.scores]):  # the Parquet writer would make them null
        return "latency_ms or scores hold a value that is not a finite number"
    return ""


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _plain(record: PredictionRecord) -> dict:
    """The record's fields for the quarantine file (tensors as their repr, shortened)."""
    fields = {k: v for k, v in vars(record).items() if k != "tensors"}
    if record.tensors is not None:
        fields["tensors"] = repr(record.tensors)[:2000]
    return fields


def _by_day(records: list[PredictionRecord]) -> dict[date, list[PredictionRecord]]:
    days: dict[date, list[PredictionRecord]] = {}
    for record in records:
        days.setdefault(record.served_at.date(), []).append(record)
    return days


def record_of(answer: Answer, status: str = OK, error: str | None = None) -> PredictionRecord:
    """The log record of a recommend answer (live or shadow)."""
    inputs = {"user_id": answer.user_id, "k": answer.k, "context": answer.context, "features": answer.features}
    return PredictionRecord(
        request_id=answer.request_id,
        served_at=answer.served_at,
        role=answer.role,
        endpoint=RECOMMEND,
        user_id=answer.user_id,
        experiment=answer.experiment,
        variant=answer.variant,
        assignments=answer.assignments,
        served_model=answer.served_model,
        registry_model=answer.model_name,
        model_version=answer.model_version,
        k=answer.k,
        inputs_hash=inputs_hash(inputs),
        latency_ms=float(answer.timings_ms.get("total", 0.0)),
        item_ids=list(answer.item_ids),
        scores=[float(s) for s in answer.scores],
        inputs=canonical_json(inputs) if answer.log_inputs else None,
        status=status,
        error=error,
        experiments_config=answer.experiments_config or None,
    )


class LiveAnswers:
    """The `on_answer` hook that logs every live recommend answer."""

    def __init__(self, log: PredictionLog):
        self.log = log

    def __call__(self, answer: Answer) -> None:
        if answer.role == LIVE:
            self.log.submit(record_of(answer))
