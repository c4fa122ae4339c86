"""The production registry path: MLflow's tracking and registry store on a real PostgreSQL server."""

from __future__ import annotations

import uuid

import pytest

from engines.models.registry import CorruptArtifactError, ModelRegistry
from tests.services import create_database, drop_database


@pytest.fixture
def postgres_registry(tmp_path):
    name = f"mlplane_registry_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    try:
        yield ModelRegistry(url.replace("postgresql://", "postgresql+psycopg2://"), str(tmp_path / "artifacts"))
    finally:
        drop_database(name)


def test_register_load_alias_and_rollback_on_postgres(postgres_registry, tmp_path):
    registry = postgres_registry
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(bytes(range(256)) * 10)
    lineage = {"mlplane.code_version": "abc123", "mlplane.data_partitions": "2026-01-01,2026-01-02"}
    first = registry.register("ranker", model, lineage, {"auc": 0.61})
    (model / "weights.bin").write_bytes(bytes(range(256)) * 11)
    second = registry.register("ranker", model, lineage, {"auc": 0.64})
    assert (first.version, second.version) == ("1", "2")
    assert registry.get("ranker", "2").tags["metric.auc"] == "0.64"

    loaded = registry.load("ranker", "1", tmp_path / "download")
    assert (loaded / "weights.bin").read_bytes() == bytes(range(256)) * 10

    registry.set_alias("ranker", "champion", "1", who="ci", reason="first")
    registry.set_alias("ranker", "champion", "2", who="ci", reason="better auc")
    assert registry.rollback("ranker", "champion", who="bob", reason="latency regression") == ("2", "1")
    assert registry.by_alias("ranker", "champion").version == "1"
    assert registry.alias_log("ranker", "champion")[-1]["who"] == "bob"
    registry.set_alias("ranker", "challenger", "2", who="ci", reason="shadow")
    registry.set_alias("ranker", "shadow", "2", who="ci", reason="shadow")
    listed = registry.versions("ranker")
    assert [(v.version, v.aliases) for v in listed] == [("1", ["champion"]), ("2", ["challenger", "shadow"])]
    assert [v.tags["metric.auc"] for v in listed] == ["0.61", "0.64"]
    assert registry.versions("no-such-model") == []
    with pytest.raises(ValueError, match="no earlier version"):
        registry.rollback("ranker", "champion", who="bob", reason="again")

    run_id = registry.get("ranker", "1").run_id
    next(p for p in (tmp_path / "artifacts").rglob("CHECKSUMS.json") if run_id in str(p)).write_text("{}")
    with pytest.raises(CorruptArtifactError, match="does not match the checksum registered"):
        registry.load("ranker", "1", tmp_path / "again")
