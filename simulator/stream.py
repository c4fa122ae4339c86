"""The simulator's streaming mode: keeps appending event files (JSON lines) to a directory, the
embedded stand-in for a Kafka topic. Each file appears atomically under a name that sorts in
write order; the Flink file source picks new files up as they land.

`append` writes a table of events as one file (tests stream a simulated day in chunks with it);
`live` writes events stamped with the wall clock at a steady rate (freshness benchmarks and demos).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa

from .files import to_jsonl, write_bytes
from .simulator import Simulator


class EventStream:
    def __init__(self, simulator: Simulator, directory: Path | str, stream: str = "interactions"):
        self.simulator = simulator
        self.directory = Path(directory)
        self.stream = stream
        self._sequence = itertools.count(_next_sequence(self.directory))

    def day_events(self, day: date) -> pa.Table:
        """The day's main batch of events, sorted by event time (then id, so the order is fixed)."""
        table = getattr(self.simulator.events(day), self.stream)
        return table.sort_by([("event_timestamp", "ascending"), (table.column_names[0], "ascending")])

    def append(self, table: pa.Table) -> Path:
        """One file holding `table`'s rows."""
        return self.append_lines(to_jsonl(table).splitlines())

    def append_lines(self, lines: list[str]) -> Path:
        """One file of raw lines, as a producer might send them (malformed ones included)."""
        path = self.directory / f"events-{next(self._sequence):09d}.jsonl"
        return write_bytes(path, "".join(line + "\n" for line in lines).encode())

    def live(
        self,
        rate_per_second: float,
        seconds: float,
        day: date,
        batch_seconds: float = 0.2,
        on_file: Callable[[Path, float, pa.Table], None] | None = None,
    ) -> int:
        """Append the day's events re-stamped to now, `rate_per_second` of them for `seconds`.

        Event ids are `live-<n>`, numbered from 0 in each call. `on_file(path, wall_time, table)` is
        called after each file lands. Returns how many events were written."""
        source = self.day_events(day)
        if source.num_rows == 0:
            raise ValueError(f"no {self.stream} events on {day} to stream")
        written, started = 0, time.time()
        while (now := time.time()) < started + seconds:
            due = int((now - started) * rate_per_second) - written
            if due > 0:
                rows = source.take([(written + k) % source.num_rows for k in range(due)])
                stamp = pa.array([datetime.fromtimestamp(now, UTC)] * due, pa.timestamp("us", "UTC"))
                ids = pa.array([f"live-{written + k}" for k in range(due)], pa.string())
                rows = rows.set_column(0, rows.column_names[0], ids).set_column(
                    rows.schema.get_field_index("event_timestamp"), "event_timestamp", stamp
                )
                path = self.append(rows)
                written += due
                if on_file:
                    on_file(path, time.time(), rows)
            time.sleep(batch_seconds)
        return written


def malformed_lines(good: pa.Table) -> list[str]:
    """One line of each kind a bad producer sends: not JSON, JSON but no object, an object with
    text after it, no timestamp, a key of the wrong type, a key that is an object, a null key."""
    row = json.loads(to_jsonl(good.slice(0, 1)))
    no_time = {k: v for k, v in row.items() if k != "event_timestamp"}
    wrong_type = {**row, "user_id": f"user-{row['user_id']}", "item_id": f"item-{row['item_id']}"}
    nested_key, null_key = {**row, "user_id": {"id": row["user_id"]}}, {**row, "item_id": None}
    return [
        '{"event_id": "broken',
        json.dumps([row]),
        json.dumps(row) + " and more",
        json.dumps(no_time),
        json.dumps(wrong_type),
        json.dumps(nested_key),
        json.dumps(null_key),
    ]


def _next_sequence(directory: Path) -> int:
    names = [p.name for p in directory.glob("events-*.jsonl")] if directory.exists() else []
    return max((int(n.split("-")[1].split(".")[0]) for n in names), default=-1) + 1
