"""The project-local Dagster instance (DAGSTER_HOME) used by the `mlplane` CLI and scripts."""

import os
from pathlib import Path

from orchestration.profiles import PROJECT_ROOT


def ensure_dagster_home() -> Path:
    """Use $DAGSTER_HOME when set; otherwise .dagster_home/ in the project, with the project's dagster.yaml."""
    home = Path(os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.symlink_to(PROJECT_ROOT / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home
