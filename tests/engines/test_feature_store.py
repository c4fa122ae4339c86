"""The feature store's production path: Redis online store and a SQL registry on PostgreSQL,
both real servers, fed from the offline tables the pipeline built; and the feast CLI on the
generated repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings
from orchestration.profiles import resources_for
from tests.conftest import LAST_DAY
from tests.services import REDIS, create_database, drop_database, redis_client


@pytest.fixture()
def registry_db():
    name = f"mlplane_feast_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    yield url.replace("postgresql://", "postgresql+psycopg2://")
    drop_database(name)


def test_redis_online_store_and_postgres_registry_serve_what_sqlite_serves(pipeline_dir, tmp_path, registry_db):
    project = f"mlplane_test_{uuid.uuid4().hex[:8]}"
    prod = FeatureStoreEngine(
        FeatureStoreSettings(
            repo_dir=tmp_path / "repo",
            offline_root=pipeline_dir / "offline",
            project=project,
            online_store="redis",
            redis_url=REDIS,
            registry_url=registry_db,
        )
    )
    local = resources_for("local", data_dir=str(pipeline_dir))["feature_store"].get_client()
    client = redis_client()
    try:
        prod.apply()
        assert {v.name for v in prod.store.list_feature_views()} >= {"user_engagement", "item_popularity"}
        prod.materialize_days(LAST_DAY, LAST_DAY)
        assert any(True for _ in client.scan_iter(count=1000))  # rows really went to the server

        rows = [{"user_id": u, "item_id": i} for u, i in [(1, 10), (5, 7), (42, 3), (99999, 1)]]
        got = prod.online_features("personalization_ranking", rows)
        want = local.online_features("personalization_ranking", rows)
        assert got == want
        assert got == prod.online_features_via_feast("personalization_ranking", rows)
        assert got["user_engagement__impressions_7d"][3] is None  # an unknown user has no values
        assert any(v for v in got["user_engagement__impressions_7d"][:3])
    finally:
        prod.store.teardown()  # removes this project's keys from Redis


def test_feast_cli_works_on_the_generated_repo(pipeline_dir, tmp_path):
    repo = shutil.copytree(pipeline_dir / "feature_repo", tmp_path / "feature_repo")  # the shared lake stays read-only
    engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=repo, offline_root=pipeline_dir / "offline"))
    engine.write_repo()
    feast = Path(sys.executable).with_name("feast")
    out = subprocess.run(
        [str(feast), "-c", str(engine.settings.repo_dir), "feature-services", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for service in ("personalization_ranking", "search", "safety"):
        assert service in out.stdout
    plan = subprocess.run(
        [str(feast), "-c", str(engine.settings.repo_dir), "plan"], capture_output=True, text=True, timeout=180
    )
    assert plan.returncode == 0, plan.stderr
    assert "user_item_affinity" in plan.stdout  # it parsed the generated definitions


def test_online_reader_returns_what_feast_returns(pipeline_dir):
    """mlplane's read path against Feast's generic SDK path, on every view of every service."""
    import polars as pl

    engine = resources_for("local", data_dir=str(pipeline_dir))["feature_store"].get_client()
    pairs = pl.read_parquet(pipeline_dir / "offline" / "user_item_affinity" / "*" / "*.parquet")
    rows = [
        {"user_id": u, "item_id": i}
        for u, i in pairs.select("user_id", "item_id").unique().sort("user_id").head(150).rows()
    ]
    reported = pl.read_parquet(pipeline_dir / "offline" / "user_reports" / "*" / "*.parquet").get_column("user_id")
    rows += [{"user_id": u, "item_id": rows[0]["item_id"]} for u in reported.unique().sort().head(20)]
    rows += [{"user_id": 10**9, "item_id": rows[0]["item_id"]}, rows[0]]  # an unknown user, a repeated row
    for service in ("personalization_ranking", "search", "safety"):
        ours = engine.online_features(service, rows)
        assert ours == engine.online_features_via_feast(service, rows), service
    assert ours["user_reports__reports_received_30d"].count(None) < len(rows)  # the comparison saw values
    with pytest.raises(KeyError, match="item_id"):
        engine.online_features("search", [{"user_id": 1}])


def test_online_reader_sees_each_write_by_another_connection(pipeline_dir, tmp_path):
    """mlplane's SQLite read keeps what entities read as until another connection commits (PRAGMA
    data_version): after a write through Feast's own store (another connection), the next read has it."""
    from datetime import UTC, datetime

    import polars as pl

    repo = shutil.copytree(pipeline_dir / "feature_repo", tmp_path / "feature_repo")
    engine = FeatureStoreEngine(FeatureStoreSettings(repo_dir=repo, offline_root=pipeline_dir / "offline"))
    offline = pl.read_parquet(pipeline_dir / "offline" / "item_popularity" / "*" / "*.parquet")
    items = offline["item_id"].unique().sort().head(30).to_list()
    rows = [{"item_id": i} for i in items]
    before = engine.online_features("search", rows)
    assert engine.online_features("search", rows) == before  # the second read comes from the kept rows
    changed = offline.filter(pl.col("item_id") == items[3]).head(1)
    changed = changed.with_columns(clicks_7d=pl.lit(987_654), event_timestamp=pl.lit(datetime.now(UTC)))
    engine.store.write_to_online_store("item_popularity", changed.to_pandas())
    after = engine.online_features("search", rows)
    assert after["item_popularity__clicks_7d"][3] == 987_654
    assert after == engine.online_features_via_feast("search", rows)
    unchanged = [k for k in before if k not in ("item_popularity__clicks_7d",)]
    assert [after[k][:3] + after[k][4:] for k in unchanged] == [before[k][:3] + before[k][4:] for k in unchanged]
