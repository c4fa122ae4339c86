"""The worker grouping of tests/tiers.py: the files that use one trained engine run on one worker."""

import re
from pathlib import Path
from types import SimpleNamespace

from tests.tiers import SHARED_FIXTURES, module_groups

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
