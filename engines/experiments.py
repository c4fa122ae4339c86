"""A/B experiments as configuration: definitions (variants mapped to registry aliases or versions,
traffic split, hashing salt) in a YAML file that the batch pipeline and online serving both read,
and the deterministic assignment of a unit (a user) to a variant. Plain Python, no Dagster.

Each experiment hashes `salt:name:unit` on its own, so any number of concurrent experiments assign
independently of each other, and a unit keeps its variant for as long as the salt stays the same.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

BUCKETS = 10_000
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class ExperimentConfigError(ValueError):
    """An experiments file that cannot be used, with the experiment and field named."""


class ModelReference:
    """A registry alias or version of the experiment's model (set by the dataclasses below)."""

    model_alias: str | None
    model_version: str | None

    @property
    def model_ref(self) -> str:
        return f"@{self.model_alias}" if self.model_alias else f"v{self.model_version}"


@dataclass(frozen=True)
class Variant(ModelReference):
    name: str
    traffic: float
    model_alias: str | None = None
    model_version: str | None = None


@dataclass(frozen=True)
class Experiment:
    name: str
    model: str
    salt: str
    variants: tuple[Variant, ...]
    description: str = ""

    def bucket(self, unit: int | str) -> int:
        digest = hashlib.sha256(f"{self.salt}:{self.name}:{unit}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % BUCKETS

    def assign(self, unit: int | str) -> Variant:
        """The unit's variant: the same unit always gets the same one."""
        bucket, upper = self.bucket(unit), 0.0
        for variant in self.variants:
            upper += variant.traffic * BUCKETS
            if bucket < round(upper):
                return variant
        return self.variants[-1]


def parse(raw: dict, source: str = "experiments") -> list[Experiment]:
    if not isinstance(raw, dict) or not isinstance(raw.get("experiments"), list):
        raise ExperimentConfigError(f"{source}: expected a mapping with a list under 'experiments'")
    experiments, salts = [], {}
    for i, entry in enumerate(raw["experiments"]):
        where = f"{source}: experiment #{i + 1} ({entry.get('name', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict):
            raise ExperimentConfigError(f"{where}: must be a mapping")
        missing = [k for k in ("name", "model", "salt", "variants") if not entry.get(k)]
        if missing:
            raise ExperimentConfigError(f"{where}: missing {', '.join(missing)}")
        name, salt = str(entry["name"]), str(entry["salt"])
        if not NAME.match(name):
            raise ExperimentConfigError(f"{where}: name must be lower_snake_case")
        if any(e.name == name for e in experiments):
            raise ExperimentConfigError(f"{where}: duplicate experiment name {name!r}")
        if salt in salts:
            raise ExperimentConfigError(
                f"{where}: salt {salt!r} is already used by {salts[salt]!r}; "
                "experiments sharing a salt would assign the same users together"
            )
        salts[salt] = name
        variants = []
        for v in entry["variants"]:
            vwhere = f"{where}: variant {v.get('name', '?') if isinstance(v, dict) else '?'}"
            if not isinstance(v, dict) or not v.get("name") or "traffic" not in v:
                raise ExperimentConfigError(f"{vwhere}: needs a name and traffic")
            if bool(v.get("model_alias")) == bool(v.get("model_version")):
                raise ExperimentConfigError(f"{vwhere}: give exactly one of model_alias or model_version")
            traffic = float(v["traffic"])
            if not 0 < traffic <= 1:
                raise ExperimentConfigError(f"{vwhere}: traffic must be in (0, 1], got {traffic}")
            variants.append(
                Variant(
                    str(v["name"]),
                    traffic,
                    v.get("model_alias"),
                    str(v["model_version"]) if v.get("model_version") else None,
                )
            )
        if len(variants) < 2 or len({v.name for v in variants}) != len(variants):
            raise ExperimentConfigError(f"{where}: needs two or more variants with distinct names")
        total = sum(v.traffic for v in variants)
        if abs(total - 1.0) > 1e-9:
            raise ExperimentConfigError(f"{where}: traffic of the variants sums to {total}, not 1")
        experiments.append(
            Experiment(name, str(entry["model"]), salt, tuple(variants), str(entry.get("description", "")))
        )
    return experiments


@dataclass(frozen=True)
class Shadow(ModelReference):
    """A model version that gets a copy of every request to `model` off the response path: its answers
    are logged beside the live ones and never served."""

    name: str
    model: str
    model_alias: str | None = None
    model_version: str | None = None


@dataclass(frozen=True)
class ExperimentsFile:
    experiments: tuple[Experiment, ...]
    shadows: tuple[Shadow, ...] = ()


def parse_shadows(raw: dict, source: str = "experiments") -> list[Shadow]:
    entries = raw.get("shadows") or []
    if not isinstance(entries, list):
        raise ExperimentConfigError(f"{source}: 'shadows' must be a list")
    shadows: list[Shadow] = []
    for i, entry in enumerate(entries):
        where = f"{source}: shadow #{i + 1} ({entry.get('name', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("model"):
            raise ExperimentConfigError(f"{where}: needs a name and a model")
        if not NAME.match(str(entry["name"])):
            raise ExperimentConfigError(f"{where}: name must be lower_snake_case")
        if any(s.name == entry["name"] for s in shadows):
            raise ExperimentConfigError(f"{where}: duplicate shadow name {entry['name']!r}")
        if bool(entry.get("model_alias")) == bool(entry.get("model_version")):
            raise ExperimentConfigError(f"{where}: give exactly one of model_alias or model_version")
        shadows.append(
            Shadow(
                str(entry["name"]),
                str(entry["model"]),
                entry.get("model_alias"),
                str(entry["model_version"]) if entry.get("model_version") else None,
            )
        )
    return shadows


def read(path: Path) -> dict:
    if not path.exists():
        raise ExperimentConfigError(f"experiments file {path} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ExperimentConfigError(f"{path}: not valid YAML: {error}") from error


def load(path: Path) -> list[Experiment]:
    return parse(read(path), str(path))


def load_file(path: Path) -> ExperimentsFile:
    """Experiments and shadows, both checked."""
    if not path.exists():
        raise ExperimentConfigError(f"experiments file {path} does not exist")
    return parse_file(path.read_bytes(), str(path))


def parse_file(data: bytes, source: str) -> ExperimentsFile:
    """`load_file` over bytes already read: the online server parses the very bytes it hashed, since the
    file may be rewritten between two reads (an in-place write is empty for a moment)."""
    try:
        raw = yaml.safe_load(data.decode())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ExperimentConfigError(f"{source}: not valid YAML: {error}") from error
    return ExperimentsFile(tuple(parse(raw, source)), tuple(parse_shadows(raw, source)))
