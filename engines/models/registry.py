"""The model registry on MLflow: versions with lineage tags, aliases with a history, rollback, and
artifacts that carry checksums.

Local default: an SQLite tracking store and a local artifact folder; production: any MLflow tracking
URI (a tracking server, or a PostgreSQL backend store directly). Plain Python, no Dagster.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

CHECKSUMS_FILE = "CHECKSUMS.json"
ARTIFACT_PATH = "model"
CHECKSUM_TAG = "mlplane.checksums_sha256"
HISTORY_TAG = "mlplane.alias_stack.{alias}"  # versions that held the alias, newest last
LOG_TAG = "mlplane.alias_log.{alias}"  # who moved the alias, when and why (newest last, capped)
LOG_LENGTH = 30
# the model card's consent to log a version's inputs (prediction-log inputs, sampled served features)
LOG_INPUTS_TAG = "mlplane.log_inputs"

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# MLflow logs every store migration at INFO
logging.getLogger("alembic").setLevel(logging.WARNING)


class CorruptArtifactError(RuntimeError):
    """A model artifact whose bytes do not match the checksums recorded when it was registered."""


@dataclass(frozen=True)
class RegisteredVersion:
    name: str
    version: str
    run_id: str
    aliases: list[str]
    tags: dict[str, str]
    created_at: datetime

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics logged at registration (tags `metric.<name>`)."""
        return {k.removeprefix("metric."): float(v) for k, v in self.tags.items() if k.startswith("metric.")}

    @property
    def log_inputs(self) -> bool:
        """Whether the model card consents to logging this version's inputs (tag mlplane.log_inputs=true)."""
        return self.tags.get(LOG_INPUTS_TAG, "").lower() == "true"


def file_checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (relative paths), except the checksum file itself."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != CHECKSUMS_FILE
    }


class ModelRegistry:
    def __init__(self, tracking_uri: str, artifact_root: str | None = None, experiment: str = "mlplane-models"):
        self.tracking_uri = tracking_uri
        self.artifact_root = artifact_root
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    @classmethod
    def local(cls, root: Path) -> ModelRegistry:
        """SQLite tracking store and artifact folder under `root`."""
        root = root.resolve()  # MLflow stores the artifact location: never relative to the caller's folder
        root.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{root / 'mlflow.db'}", str(root / "artifacts"))

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found:
            return found.experiment_id
        location = (
            Path(self.artifact_root).resolve().as_uri()
            if self.artifact_root and "://" not in self.artifact_root
            else self.artifact_root
        )
        return self.client.create_experiment(self.experiment, artifact_location=location)

    # --- registering ------------------------------------------------------------------------
    def register(
        self,
        name: str,
        model_dir: Path,
        tags: dict[str, str],
        metrics: dict[str, float],
        params: dict[str, str] | None = None,
        log_inputs: bool | None = None,
    ) -> RegisteredVersion:
        """Log the model folder with its checksums in a run and register it as a new version of
        `name`, tagged with its lineage (code version, data, run, asset, metrics) and, when
        `log_inputs` is given, the card's consent to log its inputs (LOG_INPUTS_TAG; absent: none)."""
        if log_inputs is not None:
            tags = {**tags, LOG_INPUTS_TAG: str(log_inputs).lower()}
        run = self.client.create_run(
            self._experiment_id(), run_name=f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S}", tags=tags
        )
        run_id = run.info.run_id
        try:
            for key, value in (params or {}).items():
                self.client.log_param(run_id, key, value)
            for key, metric in metrics.items():
                self.client.log_metric(run_id, key, float(metric))
            with tempfile.TemporaryDirectory() as staging:
                folder = Path(staging) / ARTIFACT_PATH
                shutil.copytree(model_dir, folder)
                (folder / CHECKSUMS_FILE).write_text(json.dumps(file_checksums(folder), indent=2, sort_keys=True))
                checksum = hashlib.sha256((folder / CHECKSUMS_FILE).read_bytes()).hexdigest()
                self.client.log_artifacts(run_id, str(folder), ARTIFACT_PATH)
            self.client.set_terminated(run_id)
        except Exception:
            self.client.set_terminated(run_id, status="FAILED")
            raise
        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name, description="Registered by mlplane")
        version_tags = {**tags, **{f"metric.{k}": f"{v:.6g}" for k, v in metrics.items()}, CHECKSUM_TAG: checksum}
        created = self.client.create_model_version(
            name, f"runs:/{run_id}/{ARTIFACT_PATH}", run_id=run_id, tags=version_tags
        )
        return self.get(name, created.version)

    # --- reading ----------------------------------------------------------------------------
    def get(self, name: str, version: str) -> RegisteredVersion:
        mv = self.client.get_model_version(name, str(version))
        return _registered(name, mv, list(mv.aliases or []))

    def by_alias(self, name: str, alias: str) -> RegisteredVersion | None:
        try:
            return self.get(name, self.client.get_model_version_by_alias(name, alias).version)
        except MlflowException:
            return None

    def versions(self, name: str) -> list[RegisteredVersion]:
        """Every version, oldest first, in two calls (MLflow's search leaves the aliases out)."""
        try:
            aliases = self.client.get_registered_model(name).aliases
        except MlflowException:
            return []
        held: dict[str, list[str]] = {}
        for alias, version in sorted(aliases.items()):
            held.setdefault(str(version), []).append(alias)
        found = self.client.search_model_versions(f"name = '{name}'")
        return sorted(
            (_registered(name, mv, held.get(str(mv.version), [])) for mv in found), key=lambda v: int(v.version)
        )

    def load(self, name: str, version: str, destination: Path) -> Path:
        """Download a version's model folder and verify every file against its checksums."""
        mv = self.get(name, version)
        destination.mkdir(parents=True, exist_ok=True)
        folder = Path(self.client.download_artifacts(mv.run_id, ARTIFACT_PATH, str(destination)))
        recorded_file = folder / CHECKSUMS_FILE
        if not recorded_file.exists():
            raise CorruptArtifactError(f"{name} v{version}: {CHECKSUMS_FILE} is missing from the artifact")
        if hashlib.sha256(recorded_file.read_bytes()).hexdigest() != mv.tags.get(CHECKSUM_TAG):
            raise CorruptArtifactError(
                f"{name} v{version}: {CHECKSUMS_FILE} does not match the checksum "
                "registered with the version; refusing to load"
            )
        recorded, actual = json.loads(recorded_file.read_text()), file_checksums(folder)
        bad = sorted(f for f in recorded.keys() | actual.keys() if recorded.get(f) != actual.get(f))
        if bad:
            raise CorruptArtifactError(
                f"{name} v{version}: artifact files {bad} do not match their registered "
                "sha256 checksums (corrupted or altered); refusing to load"
            )
        return folder

    # --- aliases ----------------------------------------------------------------------------
    def set_alias(self, name: str, alias: str, version: str, who: str, reason: str) -> None:
        """Point `alias` at `version` and record it in the alias's history."""
        stack = self._stack(name, alias)
        if not stack or stack[-1] != str(version):
            stack.append(str(version))
        self.client.set_registered_model_alias(name, alias, str(version))
        self._write_history(
            name, alias, stack, {"action": "set", "version": str(version), "who": who, "reason": reason}
        )

    def clear_alias(self, name: str, alias: str, who: str, reason: str) -> None:
        """Remove `alias` (e.g. an approval a later verdict withdrew) and record it in its history."""
        current = self.by_alias(name, alias)
        if current is None:
            return
        self.client.delete_registered_model_alias(name, alias)
        self._write_history(
            name,
            alias,
            self._stack(name, alias),
            {"action": "clear", "from": current.version, "who": who, "reason": reason},
        )

    def promote(self, name: str, alias: str, version: str, who: str, reason: str) -> str | None:
        """Move `alias` to `version` by hand, past the gate; tags the version with who did it and why
        (`mlplane.promoted.<alias>.by|reason|at`). Returns the version it held before, if any."""
        if not reason.strip():
            raise ValueError("a promotion needs a reason")
        self._stack(name, alias)  # a clear error for an unknown model
        try:
            self.client.get_model_version(name, str(version))
        except MlflowException as error:
            raise ValueError(f"{name} has no version {version}") from error
        previous = self.by_alias(name, alias)
        for key, value in {"by": who, "reason": reason, "at": _now()}.items():
            self.client.set_model_version_tag(name, str(version), f"mlplane.promoted.{alias}.{key}", value)
        self.set_alias(name, alias, str(version), who, reason)
        return previous.version if previous else None

    def rollback(self, name: str, alias: str, who: str, reason: str) -> tuple[str, str]:
        """Move `alias` back to the version it pointed at before; returns (from, to)."""
        if not reason.strip():
            raise ValueError("a rollback needs a reason")
        current = self.by_alias(name, alias)
        if current is None:
            raise ValueError(f"model {name!r} has no {alias!r} alias to roll back")
        stack = self._stack(name, alias)
        while stack and stack[-1] == current.version:
            stack.pop()
        if not stack:
            raise ValueError(f"{name!r} {alias!r} has no earlier version than v{current.version} to roll back to")
        target = stack[-1]
        self.client.set_registered_model_alias(name, alias, target)
        self.client.set_model_version_tag(
            name,
            current.version,
            f"mlplane.rolled_back_from.{alias}",
            json.dumps({"who": who, "reason": reason, "at": _now()}),
        )
        self._write_history(
            name,
            alias,
            stack,
            {"action": "rollback", "from": current.version, "version": target, "who": who, "reason": reason},
        )
        return current.version, target

    def alias_log(self, name: str, alias: str) -> list[dict]:
        return json.loads(self.client.get_registered_model(name).tags.get(LOG_TAG.format(alias=alias), "[]"))

    def _stack(self, name: str, alias: str) -> list[str]:
        try:
            tags = self.client.get_registered_model(name).tags
        except MlflowException as error:
            raise ValueError(f"no registered model named {name!r}") from error
        return json.loads(tags.get(HISTORY_TAG.format(alias=alias), "[]"))

    def _write_history(self, name: str, alias: str, stack: list[str], event: dict) -> None:
        log = [*self.alias_log(name, alias), {**event, "at": _now()}][-LOG_LENGTH:]
        self.client.set_registered_model_tag(name, HISTORY_TAG.format(alias=alias), json.dumps(stack[-LOG_LENGTH:]))
        self.client.set_registered_model_tag(name, LOG_TAG.format(alias=alias), json.dumps(log))


def _registered(name: str, mv, aliases: list[str]) -> RegisteredVersion:
    return RegisteredVersion(
        name,
        str(mv.version),
        mv.run_id,
        aliases,
        dict(mv.tags),
        datetime.fromtimestamp(mv.creation_timestamp / 1000, UTC),
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
