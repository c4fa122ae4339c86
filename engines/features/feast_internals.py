"""Feast's private API, in one place: what mlplane reads of Feast beyond its public interface, so a Feast
upgrade is checked here and nowhere else (tests/test_private_apis.py keeps every other module off it).

Feast has no public way to reach the online store of a `FeatureStore` (its `online_read` is the protocol
every store implements), nor the table and connection of its SQLite store, which the fast paths of
engines/features/sqlite_online.py and engines/features/online_write.py read and write directly."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig
    from feast.infra.online_stores.online_store import OnlineStore


def online_store(store: FeatureStore) -> OnlineStore:
    """The online store a feature store reads and writes through its provider."""
    return store._get_provider().online_store


def sqlite_connection(online: OnlineStore, config: RepoConfig) -> sqlite3.Connection:
    """The connection of Feast's SQLite online store (one per store instance)."""
    return online._get_conn(config)


def sqlite_table(config: RepoConfig, view: str) -> str:
    """The quoted name of a feature view's table in Feast's SQLite online store."""
    from feast.infra.online_stores import sqlite  # not at import: it sets sqlite3 adapters

    versioned = config.registry.enable_online_feature_view_versioning
    return sqlite._quote_id(sqlite._table_id(config.project, view, versioned))


def online_request_context(store: FeatureStore, features, full_feature_names: bool):
    """The feature views, projections and join keys Feast resolves for an online request, as its feature
    server does (serving/models/protocols/feast_api.py answers Feast's HTTP API)."""
    from feast import utils

    return utils._get_online_request_context(store.registry, store.project, features, full_feature_names)


def value_to_native(value):
    """A `Value` proto as the Python value Feast's feature server answers with."""
    from feast.feature_server_utils import _value_to_native

    return _value_to_native(value)


def timestamp_to_str(timestamp) -> str:
    """A protobuf `Timestamp` as Feast's feature server writes it."""
    from feast.feature_server_utils import _timestamp_to_str

    return _timestamp_to_str(timestamp)
