"""Reads of Feast's SQLite online store: the same answers as SqliteOnlineStore.online_read in less time.

The query is Feast's (every feature row of the entities), but only the requested features' values are
parsed and one timestamp per entity converted (the last row's, as Feast keeps it). What an entity reads
as is kept per connection (each reading thread has its own) and reused until the database changes:
`PRAGMA data_version` changes whenever another connection commits (a materialization, a push, another
process), and the cache is dropped then, so a read never returns a row older than the newest commit
that happened before it. Reading the rows is most of a read's time (Python objects per row), and the
same entities are read again and again (an item's features for every user who sees it)."""

from __future__ import annotations

import itertools
import sqlite3
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from feast.protos.feast.types.Value_pb2 import Value as ValueProto

from engines.features.feast_internals import sqlite_connection, sqlite_table

MAX_CACHED_KEYS = 50_000  # per connection; past it, entities are read and not kept until the next change


class RowCache:
    """What keys of a table read as, per requested features and decoder, for one connection at one
    data_version: (table, features, decode) -> entity key -> (event timestamp, feature -> value) or
    (None, None). The value dicts are shared between readers: read, never changed."""

    def __init__(self) -> None:
        self.stamp: tuple[int, int] | None = None  # (id of the connection, its data_version)
        self.entries: dict[tuple, dict[bytes, tuple]] = {}
        self.size = 0

    def follow(self, conn: sqlite3.Connection) -> None:
        stamp = (id(conn), conn.execute("PRAGMA data_version").fetchone()[0])
        if stamp != self.stamp:
            self.entries.clear()
            self.size = 0
            self.stamp = stamp

    def keep(self, part: dict[bytes, tuple], found: dict[bytes, tuple]) -> None:
        if self.size + len(found) <= MAX_CACHED_KEYS:
            part.update(found)
            self.size += len(found)


def sqlite_read(store, config, view, keys: list[bytes], features, decode) -> list:
    """Per key: (event timestamp, feature -> decoded value) or (None, None), for `store` (a
    SqliteOnlineStore, one per thread) and `keys` serialized as Feast serializes entity keys."""
    conn = sqlite_connection(store, config)
    cache = store.__dict__.setdefault("_mlplane_rows", RowCache())
    cache.follow(conn)
    table = sqlite_table(config, view)
    decode = decode or ValueProto.FromString
    part = cache.entries.setdefault((table, tuple(features), decode), {})
    missing = list(dict.fromkeys(k for k in keys if k not in part))
    found = _read_rows(conn, table, missing, set(features), decode) if missing else {}
    cache.keep(part, found)
    return [found[k] if k in found else part[k] for k in keys]


def _read_rows(conn: sqlite3.Connection, table: str, keys: list[bytes], wanted: set[str], decode) -> dict:
    rows = conn.execute(
        # `+event_ts`: an expression, so no per-row timestamp conversion (the column's declared type)
        f"SELECT entity_key, feature_name, value, +event_ts FROM {table} "
        f"WHERE entity_key IN ({','.join('?' * len(keys))}) ORDER BY entity_key",
        keys,
    ).fetchall()
    found: dict[bytes, tuple] = dict.fromkeys(keys, (None, None))
    for key, group in itertools.groupby(rows, key=lambda r: r[0]):
        group = list(group)
        values = {feature: decode(value) for _, feature, value, _ in group if feature in wanted}
        found[key] = (_timestamp(group[-1][3]), values)
    return found


@lru_cache(maxsize=4096)  # a handful of distinct stamps: each materialization writes one
def _timestamp(raw: Any) -> datetime:
    """A stored event_ts as Feast's SQLite store reads it: the registered TIMESTAMP converter, then UTC."""
    ts = sqlite3.converters["TIMESTAMP"](raw if isinstance(raw, bytes) else str(raw).encode())
    return ts.astimezone(UTC) if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
