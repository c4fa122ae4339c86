"""Dagster runs of one process on two threads, as the demo runs them: a call on a daemon thread, and
what Dagster needs so that two in-process runs can share a process."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Background:
    """A call on a daemon thread: a demo stopped by an error or Ctrl-C exits without waiting for it."""

    def __init__(self, call: Callable[..., object], *args: object) -> None:
        self.error: BaseException | None = None
        self.result: object = None
        self.thread = threading.Thread(target=self._run, args=(call, *args), name=call.__name__, daemon=True)
        self.thread.start()

    def _run(self, call: Callable[..., object], *args: object) -> None:
        try:
            self.result = call(*args)
        except BaseException as error:  # raised again in the caller's thread by wait()
            self.error = error

    def wait(self) -> object:
        """The call's result, once it returned; its error, raised here."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def allow_runs_on_threads() -> None:
    """Dagster calls `logging.config.dictConfig` at every run's start whenever the instance has settings,
    even without `python_logs` in dagster.yaml, only to find the handlers that section names (none).
    dictConfig closes every handler of the process while it holds logging's lock; a run on another thread,
    inside its handler's lock, then waits for logging's lock: both threads hang (seen in the demo when
    batch inference and a training started together). Without `python_logs` the call finds no handlers:
    skip it. With them, Dagster's own method runs as before (idempotent)."""
    from orchestration.dagster_internals import EventMethods

    configured = EventMethods.get_yaml_python_handlers
    if getattr(configured, "skips_empty_config", False):
        return

    def get_yaml_python_handlers(self):
        if not self._instance.get_python_log_dagster_handler_config():
            return []
        return configured(self)

    get_yaml_python_handlers.skips_empty_config = True
    EventMethods.get_yaml_python_handlers = get_yaml_python_handlers
