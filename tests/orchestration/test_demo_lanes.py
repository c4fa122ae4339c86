"""The demo's background lane: its error reaches the caller, and it never keeps a stopped demo alive."""

import threading

import pytest

from orchestration.demo import Background


def test_a_background_call_runs_and_wait_returns_its_result_or_raises_its_error():
    done = threading.Event()
    Background(done.set).wait()
    assert done.is_set()
    assert Background(lambda a, b: a + b, 40, 2).wait() == 42

    def fails(text: str) -> None:
        raise RuntimeError(text)

    lane = Background(fails, "the clip_model run failed")
    with pytest.raises(RuntimeError, match="the clip_model run failed"):
        lane.wait()


def test_a_background_lane_is_a_daemon_thread_so_an_interrupted_demo_exits():
    release = threading.Event()
    lane = Background(release.wait)
    try:
        assert lane.thread.daemon and lane.thread.is_alive()
    finally:
        release.set()
        lane.wait()
