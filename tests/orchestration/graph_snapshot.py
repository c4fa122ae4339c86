"""The asset graph as a reviewable text: every asset (group, partitions, upstream keys, checks), job
(selection, partitions, tags), schedule and sensor of `orchestration.definitions.defs`.

tests/orchestration/test_graph_snapshot.py compares it with the checked-in asset_graph.yaml, so
any change to the graph shows up in review as a diff of that file. After an intended change,
refresh the file and commit it with the change:

    .venv/bin/python -m tests.orchestration.graph_snapshot
"""

from __future__ import annotations

from pathlib import Path

import yaml
from dagster import Definitions

SNAPSHOT = Path(__file__).with_name("asset_graph.yaml")


def _partitions(partitions_def) -> str | None:
    return None if partitions_def is None else type(partitions_def).__name__


def graph_snapshot(defs: Definitions) -> dict:
    repository = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    checks: dict[str, list[str]] = {}
    for check in graph.asset_check_keys:
        checks.setdefault(check.asset_key.to_user_string(), []).append(check.name)
    assets = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        name = key.to_user_string()
        assets[name] = {
            "group": node.group_name,
            "partitions": _partitions(node.partitions_def),
            "deps": sorted(parent.to_user_string() for parent in node.parent_keys),
            "checks": sorted(checks.get(name, [])),
        }
    jobs = {
        job.name: {
            "assets": sorted(k.to_user_string() for k in job.asset_layer.selected_asset_keys),
            "partitions": _partitions(job.partitions_def),
            "tags": dict(sorted(job.tags.items())),
        }
        for job in repository.get_all_jobs()
        if not job.name.startswith("__")
    }
    schedules = {
        s.name: {
            "cron": s.cron_schedule,
            "timezone": s.execution_timezone,
            "job": s.job_name,
            "default_status": s.default_status.name,
        }
        for s in repository.schedule_defs
    }
    sensors = {
        s.name: {
            "type": s.sensor_type.name,
            "jobs": sorted(t.job_name for t in s.targets if t.job_name and not t.job_name.startswith("__")),
            "assets": sorted(k.to_user_string() for k in s.asset_selection.resolve(graph)) if s.asset_selection else [],
            "default_status": s.default_status.name,
            "minimum_interval_seconds": s.minimum_interval_seconds,
        }
        for s in repository.sensor_defs
    }
    return {"assets": assets, "jobs": jobs, "schedules": schedules, "sensors": sensors}


def render(defs: Definitions) -> str:
    return yaml.safe_dump(graph_snapshot(defs), sort_keys=True, width=120)


if __name__ == "__main__":
    from orchestration.definitions import defs

    SNAPSHOT.write_text(render(defs))
    print(f"wrote {SNAPSHOT}")
