"""The prediction log: one typed record per answer the model server gave (live) or computed off the
response path (shadow), its one schema, and where the lake keeps it. The server's writer
(serving/models/hooks/prediction_log.py), the `serving/prediction_logs` asset, online accuracy and any
other reader (exports, replays) go through this module, so the columns have one definition.

Layout: `serving/prediction_log_spool/date=D/part-<ns>.parquet` is what the server writes (many
small files, appended all day); the asset compacts a day into `serving/prediction_logs/date=D/part-0.parquet`.

Each record names the experiments file the server routed it with (`experiments_config`: the first 16
hex digits of the file's sha256), and the server stores that file's bytes once under
`serving/experiments_configs/<digest>.yaml` before any record naming it, so each experiment's control
and split are read from the configuration that was served, not from whatever the repository holds when
the analysis runs. Logs written before the column existed read it as null (`conform`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import polars as pl

ZONE = "serving"
SPOOL = "prediction_log_spool"  # written by the server
TABLE = "prediction_logs"  # taken in by the asset, one file a day
LIVE, SHADOW = "live", "shadow"
OK, ERROR = "ok", "error"

SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.String,
    "served_at": pl.Datetime("us", "UTC"),
    "role": pl.String,  # live: the answer the client got; shadow: computed beside it, never served
    "endpoint": pl.String,  # recommend, or the OIP model name of an infer call
    "user_id": pl.Int64,  # null for an infer call without a user
    "experiment": pl.String,  # the experiment whose variant answered ("" when no experiment decided)
    "variant": pl.String,  # that experiment's variant, the shadow's name, or the served entry's name
    "assignments": pl.String,  # JSON {experiment: variant} of every experiment the request was assigned in
    "served_model": pl.String,  # the server's entry that computed the answer
    "registry_model": pl.String,
    "model_version": pl.String,
    "k": pl.Int32,
    "inputs_hash": pl.String,  # sha256 of the canonical JSON of the inputs (user, k, context, features)
    "inputs": pl.String,  # the inputs' JSON where the model version's card allows it (tag mlplane.log_inputs)
    "item_ids": pl.List(pl.Int64),
    "scores": pl.List(pl.Float64),
    "outputs": pl.String,  # JSON of an infer call's outputs; null for recommend (item_ids, scores)
    "latency_ms": pl.Float64,
    "status": pl.String,
    "error": pl.String,
    "experiments_config": pl.String,  # digest of the experiments file that routed it; null: none, or an old log
}
CONFIGS = "experiments_configs"  # the experiments files the server ran, by digest


@dataclass
class PredictionRecord:
    request_id: str
    served_at: datetime
    role: str
    endpoint: str
    user_id: int | None
    experiment: str
    variant: str
    assignments: dict[str, str]
    served_model: str
    registry_model: str
    model_version: str
    k: int | None
    inputs_hash: str
    latency_ms: float
    item_ids: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    inputs: str | None = None
    outputs: str | None = None
    status: str = OK
    error: str | None = None
    experiments_config: str | None = None
    # an infer call's (inputs, outputs) arrays: hashed and serialized by the writer thread, off the request path
    tensors: tuple[dict, dict] | None = field(default=None, repr=False)
    tensor_inputs_allowed: bool = False  # the model card lets the infer call's inputs be logged

    def row(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name in SCHEMA}
        row["assignments"] = json.dumps(self.assignments, sort_keys=True)
        if self.tensors is not None:
            inputs, outputs = self.tensors
            row["inputs_hash"] = tensors_hash(inputs)
            row["outputs"] = canonical_json({k: _plain(v) for k, v in outputs.items()})
            if self.tensor_inputs_allowed:
                row["inputs"] = canonical_json({k: _plain(v) for k, v in inputs.items()})
        return row


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_plain)


def inputs_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def tensors_hash(tensors: dict) -> str:
    """sha256 over the names, dtypes, shapes and bytes of named arrays (an infer call's inputs)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = tensors[name]
        digest.update(f"{name}:{array.dtype}:{array.shape};".encode())
        digest.update(array.tobytes() if array.dtype != object else canonical_json(array.tolist()).encode())
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def frame(records: list[PredictionRecord]) -> pl.DataFrame:
    return pl.DataFrame([r.row() for r in records], schema=SCHEMA)


def conform(logs: pl.DataFrame) -> pl.DataFrame:
    """Logs in the one schema; a column a log predates (written by an older server) is null."""
    missing = [pl.lit(None, dtype).alias(name) for name, dtype in SCHEMA.items() if name not in logs.columns]
    return logs.with_columns(missing).select(list(SCHEMA)).cast(SCHEMA)


def config_digest(data: bytes) -> str:
    """How a record names the experiments file's bytes (the model server's digest of the file)."""
    return hashlib.sha256(data).hexdigest()[:16]


def config_path(lake_root: Path, digest: str) -> Path:
    return Path(lake_root) / ZONE / CONFIGS / f"{digest}.yaml"


def read_config(lake_root: Path, digest: str) -> bytes:
    """The experiments file the server ran under `digest`, checked against it."""
    path = config_path(lake_root, digest)
    if not path.exists():
        raise FileNotFoundError(f"the prediction logs name experiments config {digest}, but {path} does not exist")
    data = path.read_bytes()
    if config_digest(data) != digest:
        raise ValueError(f"{path} does not hash to {digest}: the stored experiments config was altered")
    return data


def spool_days(lake_root: Path) -> list[date]:
    folder = Path(lake_root) / ZONE / SPOOL
    return (
        sorted(date.fromisoformat(p.name.removeprefix("date=")) for p in folder.glob("date=*") if p.is_dir())
        if folder.is_dir()
        else []
    )


def read_spool(lake_root: Path, day: date) -> pl.DataFrame:
    """Every record the server wrote for the day (its files, in any order), in the one schema."""
    folder = Path(lake_root) / ZONE / SPOOL / f"date={day.isoformat()}"
    files = sorted(p for p in folder.glob("part-*.parquet")) if folder.is_dir() else []
    if not files:
        return pl.DataFrame(schema=SCHEMA)
    return pl.concat([conform(pl.read_parquet(f)) for f in files], how="vertical")
