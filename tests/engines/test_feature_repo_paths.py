"""Every path the platform writes into the Feast repository's configuration is absolute or relative to
that file's folder, so a lake given as a relative path works from any working directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from resources.feature_store import FeatureStoreResource
from resources.lake import LakeResource

FEAST = str(Path(sys.executable).with_name("feast"))


@pytest.mark.services  # feast CLI subprocesses
def test_a_relative_data_dir_gives_a_repo_the_feast_cli_reads_from_anywhere(tmp_path, monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(work)  # as `benchmarks/online_features.py --data-dir data` typed in `work`
    engine = FeatureStoreResource(lake=LakeResource(root="data")).get_client()
    engine.apply()
    repo = work / "data" / "feature_repo"

    config = yaml.safe_load((repo / "feature_store.yaml").read_text())
    assert (config["registry"], config["online_store"]["path"]) == ("registry.db", "online_store.db")
    assert "OFFLINE_ROOT = Path(__file__).resolve().parent / '../offline'" in (repo / "definitions.py").read_text()

    for cwd, repo_arg in ((work, "data/feature_repo"), (elsewhere, str(repo)), (tmp_path, "work/data/feature_repo")):
        out = subprocess.run(
            [FEAST, "-c", repo_arg, "feature-views", "list"], cwd=cwd, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, (cwd, out.stderr[-3000:])
        assert "user_engagement" in out.stdout and "item_content" in out.stdout
    # the CLI found the registry this process wrote, not a new one beside the caller
    assert sorted(p.name for p in tmp_path.rglob("registry.db")) == ["registry.db"]

    moved = tmp_path / "moved"
    (work / "data").rename(moved)  # the whole lake moves: the repository still reads its own files
    out = subprocess.run(
        [FEAST, "-c", str(moved / "feature_repo"), "feature-views", "list"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "user_engagement" in out.stdout, out.stderr[-3000:]
