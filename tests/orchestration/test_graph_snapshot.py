"""Any change to the asset graph (keys, dependencies, checks, jobs, schedules, sensors) is visible in
review as a diff of tests/orchestration/asset_graph.yaml."""

from orchestration.definitions import defs
from tests.orchestration.graph_snapshot import SNAPSHOT, render


def test_the_asset_graph_matches_its_checked_in_snapshot():
    current = render(defs)
    assert SNAPSHOT.exists(), "no snapshot: run .venv/bin/python -m tests.orchestration.graph_snapshot"
    assert current == SNAPSHOT.read_text(), (
        "the asset graph changed; if that is intended, run `.venv/bin/python -m tests.orchestration.graph_snapshot` "
        "and commit tests/orchestration/asset_graph.yaml with the change"
    )
