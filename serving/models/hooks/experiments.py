"""A/B experiments and shadows in the server, from `deploy/experiments.yaml` (engines.experimentation.experiments).

Every request's user is assigned in every experiment that includes it
(`engines.experimentation.experiments.assignments`: sticky, the same user gets the same variant while the salts
stay). The experiments on the recommend model share one layer (the file is refused otherwise), so a user is in
at most one of them: that experiment's variant answers (`engines.experimentation.experiments.deciding`), and a
user in none of them gets the recommend model's own entry. Experiments in other layers overlap orthogonally and
are only logged here. Each experiment's arms therefore get exactly their own variant, and comparing them (intent
to treat, as online accuracy does) estimates that experiment's effect alone. All assignments are logged per
answer.

A variant or shadow names an alias or version of the registry model; it is served by the entry that
already follows it, or by an entry added for it (`<model>@<alias>`, `<model>@v<version>`) and loaded
before the new file is used.

Each route names the file's digest (`Route.config`), logged with the answer; the file's bytes go to
`on_config` (the prediction log stores them) before the first request is routed with it, so the
analysis reads each experiment's control and split from the file that was served.

The file is re-read when it changes; the new configuration is built aside (parsed, its models loaded)
and swapped in with one reference assignment, so requests in flight finish on the old one and none is
dropped. A file that does not parse, or names a model that does not load, leaves the running
configuration in place and `reason` says why (GET /v2/experiments)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engines.experimentation.experiments import (
    Experiment,
    ExperimentConfigError,
    ExperimentsFile,
    Layer,
    Shadow,
    assignments,
    deciding,
    parse_file,
)
from engines.experimentation.prediction_logs import config_digest
from serving.models.config import ModelEntry
from serving.models.kinds.recommend import Route
from serving.models.repository import ModelRepository

log = logging.getLogger("mlplane.models")


@dataclass(frozen=True)
class Snapshot:
    """One configuration in use; never changed, only replaced."""

    experiments: tuple[Experiment, ...] = ()
    routing: tuple[Experiment, ...] = ()  # the experiments on the recommend model (one layer)
    layers: tuple[Layer, ...] = ()
    shadows: tuple[Shadow, ...] = ()  # the shadows of the recommend model
    entries: dict[tuple[str, str], str] = field(default_factory=dict)  # (experiment or "", variant) -> entry
    digest: str = ""


class ExperimentRouter:
    def __init__(
        self,
        path: Path | None,
        repository: ModelRepository,
        default_model: str,
        on_config: Callable[[str, bytes], None] | None = None,
    ):
        self.path = path
        self.on_config = on_config or (lambda digest, data: None)  # told each file before it is used
        self.repository = repository
        self.default_model = default_model
        self.snapshot = Snapshot()
        self.reason = ""  # why the file on disk is not the configuration in use ("" when it is)
        self._refused = ""  # the digest of a file refused (re-read only once it changes)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the request path: one reference read, no lock -----------------------------------------------
    def choose(self, user_id: int, context: dict) -> Route:
        snap = self.snapshot
        assigned = assignments(snap.experiments, user_id)
        decided = deciding(snap.routing, snap.routing[0].model, user_id) if snap.routing else None
        if decided is None:
            return Route(self.default_model, "", self.default_model, assigned, snap.digest)
        experiment, variant = decided
        entry = snap.entries[(experiment.name, variant.name)]
        return Route(entry, experiment.name, variant.name, assigned, snap.digest)

    def shadows(self) -> list[tuple[Shadow, str]]:
        snap = self.snapshot
        return [(s, snap.entries[("", s.name)]) for s in snap.shadows]

    def describe(self) -> dict:
        snap = self.snapshot
        return {
            "file": str(self.path) if self.path else None,
            "reason": self.reason,
            "digest": snap.digest,
            "experiments": [
                {
                    "name": e.name,
                    "model": e.model,
                    "routes_recommend": e in snap.routing,
                    "layer": e.layer,
                    "slice": list(e.slice),
                    "variants": [
                        {
                            "name": v.name,
                            "model_ref": v.model_ref,
                            "traffic": v.traffic,
                            "served_by": snap.entries.get((e.name, v.name)),
                        }
                        for v in e.variants
                    ],
                }
                for e in snap.experiments
            ],
            "layers": [
                {
                    "name": layer.name,
                    "model": layer.model,
                    "salt": layer.salt,
                    "domain": layer.domain,
                    "description": layer.description,
                }
                for layer in snap.layers
            ],
            "shadows": [
                {"name": s.name, "model": s.model, "model_ref": s.model_ref, "served_by": snap.entries[("", s.name)]}
                for s in snap.shadows
            ],
        }

    # --- (re)loading ------------------------------------------------------------------------------
    def reload(self) -> bool:
        """Use the file if it changed and is valid; True when a new configuration is in use."""
        if self.path is None:
            return False
        with self._lock:
            try:
                data = self.path.read_bytes()
            except OSError as error:
                return self._refuse(f"experiments file {self.path} unreadable ({error})")
            digest = config_digest(data)
            if digest in (self.snapshot.digest, self._refused):  # unchanged, or refused already
                return False
            try:
                parsed = parse_file(data, str(self.path))
                snapshot = self._build(parsed, digest)
            except ExperimentConfigError as error:
                self._refused = digest
                return self._refuse(str(error))
            self.on_config(digest, data)
            self.snapshot, self.reason = snapshot, ""
            log.info(
                "experiments: %d in use (%d route recommend), %d shadows, file %s",
                len(snapshot.experiments),
                len(snapshot.routing),
                len(snapshot.shadows),
                digest,
            )
            return True

    def _refuse(self, reason: str) -> bool:
        if reason != self.reason:
            log.warning("experiments: keeping the running configuration: %s", reason)
        self.reason = f"{reason}; the running configuration ({self.snapshot.digest or 'none'}) stays in use"
        return False

    def _build(self, parsed: ExperimentsFile, digest: str) -> Snapshot:
        experiments, shadows = parsed.experiments, parsed.shadows
        if self.default_model not in self.repository.states:
            raise ExperimentConfigError(f"the recommend model {self.default_model!r} is not served here")
        default = self.repository.states[self.default_model].entry
        routing = tuple(e for e in experiments if e.model == default.registry_model)
        mine = tuple(s for s in shadows if s.model == default.registry_model)
        wanted = {(e.name, v.name): (v.model_alias, v.model_version) for e in routing for v in e.variants}
        wanted.update({("", s.name): (s.model_alias, s.model_version) for s in mine})
        entries, added = {}, []
        for key, (alias, version) in wanted.items():
            name = self.repository.find(default.registry_model, alias, version)
            if name is None:
                name = f"{default.registry_model}@{alias or 'v' + str(version)}"
                entry = ModelEntry(
                    name=name, registry_model=default.registry_model, kind=default.kind, alias=alias, version=version
                )
                if name not in self.repository.states:
                    added.append(name)
                state = self.repository.ensure(entry)
            else:
                state = self.repository.ensure(self.repository.states[name].entry)
            if state.current is None:
                for fresh in added:
                    self.repository.discard(fresh)
                what = f"experiment {key[0]!r} variant {key[1]!r}" if key[0] else f"shadow {key[1]!r}"
                raise ExperimentConfigError(f"{what}: model {name!r} does not serve ({state.reason or 'not loaded'})")
            entries[key] = name
        return Snapshot(tuple(experiments), routing, parsed.layers, mine, entries, digest)

    def start(self, interval_s: float) -> None:
        def watch() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.reload()
                except Exception:  # never let the watcher die
                    log.exception("reloading the experiments failed")

        self._thread = threading.Thread(target=watch, name="experiments-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
