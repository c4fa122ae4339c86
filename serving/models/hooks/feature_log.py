"""A sample of the feature vectors `recommend` served, written to the lake for the skew check
(`serving/served_features/date=D/part-<n>.parquet`; the asset check reads the same path). Sampling
is a hook on the answer path: rows are buffered in memory and written by a background thread, so
an answer never waits for the disk; a clean stop writes what is buffered.

Served features are a model's inputs: only answers of a model version whose card consents to logging
its inputs (registry tag mlplane.log_inputs=true, as for the prediction log's inputs) are sampled, and
each row carries that consent; answers of other versions are counted, never written."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from pathlib import Path

import polars as pl

from engines.models.registry import LOG_INPUTS_TAG
from serving.models.kinds.recommend import Answer

log = logging.getLogger("mlplane.models")
ZONE, TABLE = "serving", "served_features"
SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.String(),
    "served_at": pl.Datetime("us", "UTC"),
    "user_id": pl.Int64(),
    "model_name": pl.String(),
    "model_version": pl.String(),
    "feature_service": pl.String(),
    "features": pl.String(),
    "consent": pl.String(),  # the model card's tag that let the row be written
}
CONSENT = f"{LOG_INPUTS_TAG}=true"


class FeatureLog:
    def __init__(self, lake_root: Path, sample: float, flush_interval_s: float = 5.0, seed: int | None = None):
        self.folder = Path(lake_root) / ZONE / TABLE
        self.sample = sample
        self.flush_interval_s = flush_interval_s
        self._random = random.Random(seed)
        self._rows: list[dict] = []
        self.without_consent = 0  # answers not sampled: their model's card does not consent
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feature-log", daemon=True)
        self._thread.start()

    def __call__(self, answer: Answer) -> None:
        if not answer.log_inputs:
            self.without_consent += 1
            return
        if self.sample <= 0 or self._random.random() >= self.sample:
            return
        row = {
            "request_id": answer.request_id,
            "served_at": answer.served_at,
            "user_id": answer.user_id,
            "model_name": answer.model_name,
            "model_version": answer.model_version,
            "feature_service": answer.feature_service,
            "features": json.dumps(answer.features, default=str, sort_keys=True),
            "consent": CONSENT,
        }
        with self._lock:
            self._rows.append(row)

    def flush(self) -> Path | None:
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return None
        day = rows[0]["served_at"].date()  # a file per flush; its rows' days are read from served_at
        path = self.folder / f"date={day.isoformat()}" / f"part-{time.time_ns()}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            pl.DataFrame(rows, schema=SCHEMA).write_parquet(tmp)
            tmp.replace(path)
        except Exception:
            with self._lock:  # kept for the next try
                self._rows = rows + self._rows
            tmp.unlink(missing_ok=True)
            raise
        return path

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
            except Exception:  # the disk is full or gone: keep the rows for the next try
                log.exception("writing served features failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.flush()
