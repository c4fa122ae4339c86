"""Shadow variants: each live recommend answer hands a copy of its request (user, k, context and the
features it read) to a small pool of worker threads, which compute every configured shadow's answer
and log it beside the live one (same request id, role `shadow`). The hook only counts and submits, so
the live answer is never changed or held up by a shadow; a shadow that fails is logged as an error
record. When the shadows fall behind by `max_pending` requests, further copies are skipped and
counted (`mlplane_shadow_requests{outcome="skipped"}`): a shadow is a sample, never a reason to slow
or refuse live traffic."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from engines.experimentation.experiments import Shadow
from engines.experimentation.prediction_logs import ERROR, SHADOW, PredictionRecord
from serving.models.kinds.recommend import Answer, Recommender, Route
from serving.models.metrics import ServerMetrics

log = logging.getLogger("mlplane.models")

ShadowSource = Callable[[], list[tuple[Shadow, str]]]  # the shadows in use, with the entry serving each


class ShadowRunner:
    def __init__(
        self,
        shadows: ShadowSource,
        recommender: Recommender,
        submit: Callable[[PredictionRecord], None],
        metrics: ServerMetrics,
        workers: int = 2,
        max_pending: int = 1000,
    ):
        self.shadows = shadows
        self.recommender = recommender
        self.submit = submit
        self.metrics = metrics
        self.max_pending = max_pending
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="shadow")
        self._pending = 0
        self._lock = threading.Lock()

    def __call__(self, live: Answer) -> None:
        if live.role != "live":
            return
        for shadow, entry in self.shadows():
            with self._lock:
                if self._pending >= self.max_pending:
                    self.metrics.shadow(shadow.name, "skipped")
                    continue
                self._pending += 1
            self._executor.submit(self._run, shadow, entry, live)

    def _run(self, shadow: Shadow, entry: str, live: Answer) -> None:
        from serving.models.hooks.prediction_log import record_of

        started = time.perf_counter()
        route = Route(entry, "", shadow.name, live.assignments, live.experiments_config)
        try:
            loaded = self.recommender.repository.get(entry)
            answer = self.recommender.answer_with(
                loaded, route, live.user_id, live.k, live.context, live.features, live.request_id
            )
            answer.role = SHADOW
            answer.timings_ms["total"] = (time.perf_counter() - started) * 1000
            record = record_of(answer)
            outcome = "ok"
        except Exception as error:  # noqa: BLE001 - a failing shadow is logged, never raised
            failed = Answer(
                live.request_id,
                live.user_id,
                live.k,
                live.context,
                shadow.name,
                shadow.model,
                "",
                live.feature_service,
                [],
                [],
                live.features,
                live.served_at,
                {"total": (time.perf_counter() - started) * 1000},
                entry,
                "",
                live.assignments,
                SHADOW,
                live.log_inputs,
                live.experiments_config,
            )
            record = record_of(failed, status=ERROR, error=f"{type(error).__name__}: {error}")
            outcome = "error"
        finally:
            with self._lock:
                self._pending -= 1
        self.metrics.shadow(shadow.name, outcome)
        try:
            self.submit(record)
        except Exception:  # the log's backlog is full: a shadow record is not worth refusing anyone for
            self.metrics.shadow(shadow.name, "unlogged")
            log.warning("shadow %s: prediction log refused the record", shadow.name)

    def close(self) -> None:
        """Finish the shadows already submitted (their records go to the log before it closes)."""
        self._executor.shutdown(wait=True)
