"""The worker grouping of tests/tiers.py: the files that use one trained engine run on one worker."""

import re
from pathlib import Path
from types import SimpleNamespace

from tests.tiers import SHARED_FIXTURES, join_group, module_groups

TESTS = Path(__file__).parent


def item(path: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(path=TESTS / path, fixturenames=list(fixtures))


def test_files_sharing_a_trained_engine_share_a_group_and_others_keep_theirs():
    items = [
        item("serving/models/test_feast_api.py", "served_lake", "platform_server"),
        item("serving/models/test_feast_api.py", "tmp_path"),
        item("serving/models/test_recommend.py", "platform_server", "served_lake"),
        item("serving/models/test_grpc.py", "tower_registry"),
        item("models/test_personalization.py", "trained"),
        item("models/test_batch_inference.py", "ray_compute", "trained"),
        item("streaming/test_backfill.py", "pipeline_dir"),
        item("streaming/test_cluster.py", "flink_cluster"),
    ]
    groups = module_groups(items)
    assert groups[TESTS / "serving/models/test_feast_api.py"] == groups[TESTS / "serving/models/test_recommend.py"]
    assert groups[TESTS / "models/test_personalization.py"] == groups[TESTS / "models/test_batch_inference.py"]
    assert groups[TESTS / "serving/models/test_grpc.py"] == "tests/serving/models/test_grpc.py"
    assert groups[TESTS / "streaming/test_backfill.py"] == groups[TESTS / "streaming/test_cluster.py"]
    assert len(set(groups.values())) == 4


def test_every_shared_engine_is_a_session_fixture():
    # a renamed or narrowed fixture would silently drop its files back to one group each
    sources = "\n".join(p.read_text() for p in TESTS.rglob("conftest.py"))
    for fixture in SHARED_FIXTURES:
        assert re.search(rf'@pytest.fixture\(scope="session"\)\ndef {fixture}\(', sources), fixture


def test_the_group_reaches_the_test_id_that_xdist_schedules_by(request):
    # pytest-xdist's loadgroup scheduler reads the group from the id; pytest 9 ignores where xdist writes it
    from _pytest.nodeid import NodeId
    from xdist.scheduler.loadgroup import LoadGroupScheduling

    item, before = request.node, request.node._id
    plain = item.nodeid.split("@")[0]  # under xdist the id already carries this file's group
    try:
        item._id = NodeId.parse(plain)
        join_group(item, "tests/models:trained")
        assert item.nodeid == f"{plain}@tests/models:trained"
        assert LoadGroupScheduling._split_scope(None, item.nodeid) == "tests/models:trained"
        join_group(item, "another")  # once only
        assert item.nodeid.count("@") == 1
    finally:
        item._id = before
