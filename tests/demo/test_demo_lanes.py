"""The demo's background lane: its error reaches the caller, and it never keeps a stopped demo alive."""

import threading

import pytest

from orchestration.lanes import Background


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


def instance_with_settings(home, python_logs: str = ""):
    """A persistent instance whose dagster.yaml has settings (the project's has the run coordinator and
    telemetry), so that Dagster configures logging at every run's start."""
    from dagster import DagsterInstance

    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n" + python_logs)
    return DagsterInstance.from_config(str(home))


@pytest.fixture
def lanes_allowed(monkeypatch):
    """allow_runs_on_threads for one test: Dagster's method is put back afterwards."""
    from orchestration.dagster_internals import EventMethods
    from orchestration.lanes import allow_runs_on_threads

    monkeypatch.setattr(EventMethods, "get_yaml_python_handlers", EventMethods.get_yaml_python_handlers)
    allow_runs_on_threads()
    allow_runs_on_threads()  # idempotent: wraps Dagster's method once


def chatty_job():
    from dagster import job, op

    @op
    def talk(context):
        for n in range(20):
            context.log.info(f"line {n}")

    @job
    def chatty():
        talk()

    return chatty


def test_runs_on_two_threads_no_longer_reconfigure_logging_at_each_start(tmp_path, monkeypatch, lanes_allowed):
    import logging.config

    calls = []
    monkeypatch.setattr(logging.config, "dictConfig", lambda config: calls.append(config))
    instance = instance_with_settings(tmp_path)
    job = chatty_job()
    failures = []

    def runs() -> None:
        for _ in range(5):
            if not job.execute_in_process(instance=instance).success:
                failures.append("a run failed")

    lanes = [Background(runs), Background(runs)]
    for lane in lanes:
        lane.thread.join(timeout=300)
    assert not any(lane.thread.is_alive() for lane in lanes), "two threads' runs hung"
    assert not failures and calls == []
    assert len(instance.get_runs()) == 10


def test_a_python_logs_section_still_gets_its_handlers(tmp_path, lanes_allowed):
    """With `python_logs` in dagster.yaml, Dagster's own method runs: its handler receives the run's logs."""
    log = tmp_path / "runs.log"
    python_logs = (
        "python_logs:\n  dagster_handler_config:\n    handlers:\n      to_file:\n"
        f"        class: logging.FileHandler\n        filename: {log}\n        level: INFO\n"
    )
    instance = instance_with_settings(tmp_path, python_logs)
    assert chatty_job().execute_in_process(instance=instance).success
    assert "line 19" in log.read_text()
