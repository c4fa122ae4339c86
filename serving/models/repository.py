"""The served models: each entry follows a registry model's alias (or a pinned version). A version is
downloaded with its checksums verified, loaded beside the one serving, then swapped in with one
reference assignment, so requests already holding the old version finish on it and none is dropped.
A version that fails to download, verify or load leaves the previous one serving, and the entry's
`reason` says why.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engines.models.registry import ModelRegistry, RegisteredVersion
from serving.models.config import ModelEntry
from serving.models.kinds.base import ServedModel
from serving.models.protocols.protocol import ProtocolError, RepositoryModel

log = logging.getLogger("mlplane.models")

Loader = Callable[[ModelEntry, Path, RegisteredVersion], ServedModel]  # entry, verified folder, version -> model


@dataclass(frozen=True)
class LoadedVersion:
    entry: ModelEntry
    version: str
    model: ServedModel
    loaded_at: float
    folder: Path | None = None  # its download, deleted when it stops serving


@dataclass
class EntryState:
    entry: ModelEntry  # what it follows now: its configuration, or what a repository load asked for
    current: LoadedVersion | None = None
    reason: str = ""  # why the newest version is not the one serving (or why nothing serves)
    failed_version: str | None = None  # not retried until the alias moves again
    unloaded: bool = False
    configured: ModelEntry | None = None  # the configuration's entry; a load without parameters returns to it

    def __post_init__(self) -> None:
        self.configured = self.configured or self.entry

    @property
    def overridden(self) -> bool:
        return (self.entry.alias, self.entry.version) != (self.configured.alias, self.configured.version)


class ModelRepository:
    def __init__(
        self,
        registry: ModelRegistry,
        entries: list[ModelEntry],
        loader: Loader,
        workdir: Path,
        on_swap: Callable[[LoadedVersion], None] | None = None,
    ):
        self.registry = registry
        self.loader = loader
        self.workdir = workdir
        self.on_swap = on_swap or (lambda loaded: None)
        self.states = {e.name: EntryState(e) for e in entries}
        self._lock = threading.Lock()  # one load at a time; reads never take it
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    # --- reading (the request path: no lock, one dict lookup) -------------------------------
    def get(self, name: str, version: str | None = None) -> LoadedVersion:
        state = self.states.get(name)
        if state is None:
            raise ProtocolError(404, f"unknown model {name!r}; models: {sorted(self.states)}")
        current = state.current
        if current is None:
            raise ProtocolError(
                503 if not state.unloaded else 409, f"model {name!r} is not ready: {state.reason or 'not loaded'}"
            )
        if version is not None and version != current.version:
            raise ProtocolError(
                404,
                f"model {name!r} has no version {version!r} loaded; it serves v{current.version} "
                f"({state.entry.follows})",
            )
        return current

    def index(self, ready_only: bool = False) -> list[RepositoryModel]:
        out = []
        for name, state in sorted(self.states.items()):
            current = state.current
            if ready_only and current is None:
                continue
            out.append(
                RepositoryModel(
                    name=name,
                    version=current.version if current else None,
                    state="READY" if current else "UNAVAILABLE",
                    reason=state.reason,
                    follows=state.entry.follows,
                    overridden=state.overridden,
                )
            )
        return out

    # --- loading ------------------------------------------------------------------------------
    def refresh(self, names: list[str] | None = None) -> None:
        """Load the version each entry's alias points at now, where it is not the one serving."""
        states = self.states  # entries may be added or discarded meanwhile (experiments)
        for name in names or list(states):
            state = states.get(name)
            if state is not None and not state.unloaded:
                self._refresh(state)

    def _refresh(self, state: EntryState) -> None:
        entry = state.entry
        try:
            if entry.version is not None:
                target = entry.version
            else:
                found = self.registry.by_alias(entry.registry_model, entry.alias)
                if found is None:
                    state.reason = f"registry model {entry.registry_model!r} has no {entry.alias!r} alias"
                    return
                target = found.version
        except Exception as error:  # registry down: keep serving what is loaded
            state.reason = f"registry unreachable: {error}"
            return
        current = state.current
        if (current and current.version == target) or state.failed_version == target:
            return
        with self._lock:
            if state.unloaded:  # unloaded while the registry was read: the poller must not bring it back
                return
            self._load(state, target)

    def _load(self, state: EntryState, version: str) -> None:
        entry = state.entry
        folder = self.workdir / entry.name / f"v{version}-{time.time_ns()}"
        started = time.perf_counter()
        try:
            info = self.registry.get(entry.registry_model, version)
            artifact = self.registry.load(entry.registry_model, version, folder)  # checksums verified
            model = self.loader(entry, artifact, info)
        except Exception as error:
            previous = f"still serving v{state.current.version}" if state.current else "nothing serving"
            state.reason = f"v{version} failed to load ({type(error).__name__}: {error}); {previous}"
            state.failed_version = version
            log.warning("%s: %s", entry.name, state.reason)
            shutil.rmtree(folder, ignore_errors=True)
            return
        old, state.current = state.current, LoadedVersion(entry, version, model, time.time(), folder)
        state.reason, state.failed_version = "", None
        log.info(
            "%s: serving %s v%s (loaded in %.1f s)",
            entry.name,
            entry.registry_model,
            version,
            time.perf_counter() - started,
        )
        self.on_swap(state.current)
        retire(old)

    def load(self, name: str, parameters: dict | None = None) -> RepositoryModel:
        """The repository extension's load: (re)load now, following another alias or version where the
        parameters name one, else the entry's configuration again (a pin is undone by a plain load)."""
        state = self.states.get(name)
        if state is None:
            raise ProtocolError(404, f"unknown model {name!r}; models: {sorted(self.states)}")
        parameters = parameters or {}
        unknown = sorted(set(parameters) - {"version", "alias"})
        if unknown or len(parameters) > 1:
            raise ProtocolError(400, f"load takes one of the parameters 'version' or 'alias', got {sorted(parameters)}")
        if parameters:
            key, value = next(iter(parameters.items()))
            if not isinstance(value, str | int) or isinstance(value, bool) or not str(value):
                raise ProtocolError(400, f"parameter {key!r} must be a non-empty string")
            fields = {"version": str(value), "alias": None} if key == "version" else {"alias": value, "version": None}
            state.entry = state.entry.model_copy(update=fields)
        else:
            state.entry = state.configured
        state.unloaded, state.failed_version = False, None
        self._refresh(state)
        if state.current is None or (state.entry.version and state.current.version != state.entry.version):
            raise ProtocolError(400, f"model {name!r} did not load: {state.reason}")
        return self.index_of(name)

    def ensure(self, entry: ModelEntry) -> EntryState:
        """Serve `entry` too (experiment variants, shadows) and load it now. The states mapping is replaced,
        never changed in place, so readers iterating it are never disturbed."""
        state = self.states.get(entry.name)
        if state is None:
            state = EntryState(entry)
            self.states = {**self.states, entry.name: state}
        if state.current is None and not state.unloaded:
            self._refresh(state)
        return state

    def discard(self, name: str) -> None:
        """Forget an entry `ensure` added that turned out unusable."""
        state = self.states.get(name)
        if state is not None:
            self.states = {k: v for k, v in self.states.items() if k != name}
            retire(state.current)

    def find(self, registry_model: str, alias: str | None, version: str | None) -> str | None:
        """The entry already following this alias (or pinned to this version) of a registry model."""
        for name, state in self.states.items():
            e = state.entry
            if e.registry_model == registry_model and e.alias == alias and e.version == version:
                return name
        return None

    def unload(self, name: str) -> None:
        state = self.states.get(name)
        if state is None:
            raise ProtocolError(404, f"unknown model {name!r}; models: {sorted(self.states)}")
        with self._lock:
            old, state.current, state.unloaded = state.current, None, True
            state.reason = "unloaded through the repository API"
        retire(old)

    def index_of(self, name: str) -> RepositoryModel:
        return next(m for m in self.index() if m.name == name)

    # --- following the aliases ---------------------------------------------------------------
    def start(self, interval_s: float) -> None:
        def poll() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.refresh()
                except Exception:  # never let the poller die
                    log.exception("refreshing the served models failed")

        self._poller = threading.Thread(target=poll, name="model-alias-poller", daemon=True)
        self._poller.start()

    def stop(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(30)

    def close(self) -> None:
        """Stop following the aliases and retire every loaded version (its download deleted)."""
        self.stop()
        for state in self.states.values():
            retire(state.current)


def retire(loaded: LoadedVersion | None) -> None:
    """A version that stopped serving: closed, and its download folder deleted so loads never grow the disk."""
    if loaded is None:
        return
    loaded.model.close()
    if loaded.folder is not None:
        shutil.rmtree(loaded.folder, ignore_errors=True)
