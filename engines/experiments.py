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


@dataclass(frozen=True)
class Variant:
    name: str
    traffic: float
    model_alias: str | None = None
    model_version: str | None = None

    @property
    def model_ref(self) -> str:
        return f"@{self.model_alias}" if self.model_alias else f"v{self.model_version}"


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
            raise ExperimentConfigError(f"{where}: salt {salt!r} is already used by {salts[salt]!r}; "
                                        "experiments sharing a salt would assign the same users together")
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
            variants.append(Variant(str(v["name"]), traffic, v.get("model_alias"),
                                    str(v["model_version"]) if v.get("model_version") else None))
        if len(variants) < 2 or len({v.name for v in variants}) != len(variants):
            raise ExperimentConfigError(f"{where}: needs two or more variants with distinct names")
        total = sum(v.traffic for v in variants)
        if abs(total - 1.0) > 1e-9:
            raise ExperimentConfigError(f"{where}: traffic of the variants sums to {total}, not 1")
        experiments.append(Experiment(name, str(entry["model"]), salt, tuple(variants),
                                      str(entry.get("description", ""))))
    return experiments


def load(path: Path) -> list[Experiment]:
    if not path.exists():
        raise ExperimentConfigError(f"experiments file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ExperimentConfigError(f"{path}: not valid YAML: {error}") from error
    return parse(raw, str(path))
