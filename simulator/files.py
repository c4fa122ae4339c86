"""Landing file schemas and atomic writers (parquet or JSON lines)."""

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engines.data.lake import to_jsonl

TIMESTAMP = pa.timestamp("us", tz="UTC")

# Column names and types exactly as in docs/landing-format.md.
SCHEMAS = {
    "interactions": pa.schema(
        [
            ("event_id", pa.string()),
            ("event_timestamp", TIMESTAMP),
            ("user_id", pa.int64()),
            ("item_id", pa.int64()),
            ("event_type", pa.string()),
            ("session_id", pa.string()),
            ("device", pa.string()),
            ("play_seconds", pa.float64()),
            ("amount", pa.float64()),
        ]
    ),
    "chat_messages": pa.schema(
        [
            ("message_id", pa.string()),
            ("event_timestamp", TIMESTAMP),
            ("sender_id", pa.int64()),
            ("receiver_id", pa.int64()),
            ("item_id", pa.int64()),
            ("text", pa.string()),
        ]
    ),
    "abuse_reports": pa.schema(
        [
            ("report_id", pa.string()),
            ("event_timestamp", TIMESTAMP),
            ("reporter_id", pa.int64()),
            ("reported_user_id", pa.int64()),
            ("item_id", pa.int64()),
            ("reason", pa.string()),
        ]
    ),
    "items": pa.schema(
        [
            ("item_id", pa.int64()),
            ("creator_id", pa.int64()),
            ("category", pa.string()),
            ("title", pa.string()),
            ("description", pa.string()),
            ("price", pa.float64()),
            ("thumbnail_path", pa.string()),
            ("mesh_path", pa.string()),
            ("created_at", TIMESTAMP),
            ("updated_at", TIMESTAMP),
        ]
    ),
    "users": pa.schema(
        [
            ("user_id", pa.int64()),
            ("country", pa.string()),
            ("region", pa.string()),
            ("age_bucket", pa.string()),
            ("is_creator", pa.bool_()),
            ("signup_at", TIMESTAMP),
            ("updated_at", TIMESTAMP),
        ]
    ),
    "creators": pa.schema(
        [
            ("creator_id", pa.int64()),
            ("user_id", pa.int64()),
            ("display_name", pa.string()),
            ("joined_at", TIMESTAMP),
            ("updated_at", TIMESTAMP),
        ]
    ),
}
EVENT_STREAMS = ("interactions", "chat_messages", "abuse_reports")
DIMENSIONS = ("items", "users", "creators")


def frame_to_table(frame: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """The schema's columns of `frame`; timestamp columns hold int64 microseconds since the epoch."""
    return pa.table(
        {
            field.name: pa.array(
                frame[field.name].to_numpy() if pa.types.is_timestamp(field.type) else frame[field.name],
                type=field.type,
                from_pandas=True,
            )
            for field in schema
        },
        schema=schema,
    )


def write_bytes(path: Path, data: bytes) -> Path:
    """Write via a hidden temp file in the same folder, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def write_table(table: pa.Table, path: Path) -> Path:
    """Write `table` as parquet or JSON lines depending on the path's suffix, atomically."""
    if path.suffix == ".jsonl":
        return write_bytes(path, to_jsonl(table).encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path
