"""A/B experiments as configuration: definitions (variants mapped to registry aliases or versions,
traffic split, hashing salt) in a YAML file that the batch pipeline and online serving both read,
and the deterministic assignment of a unit (a user) to a variant. Plain Python, no Dagster.

Experiments are grouped in layers (Tang et al., KDD 2010, "Overlapping experiment infrastructure"). A
layer decides one thing, the version of one model, and its experiments split the layer's users without
overlap: each takes a slice [start, end) of the layer's buckets, hashed from `layer:<layer salt>:unit`.
Layers hash with their own salt, so experiments in different layers overlap orthogonally. Within its
slice an experiment hashes `salt:name:unit` to pick the variant. An experiment outside any layer is a
layer of its own over all units, assigned exactly as before layers existed. A model is decided by at
most one layer, so a unit meets at most one experiment per model (`deciding`); a file that breaks that
is refused with the layer and experiments named.

Domains set units apart: each takes a slice of one fixed hash (`domain:unit`), and a layer in a domain
sees only its units; layers outside any domain see the units outside every domain. A model may then be
decided by one layer in each domain, as the domains never share a unit.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

BUCKETS = 10_000
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
WHOLE = (0.0, 1.0)


class ExperimentConfigError(ValueError):
    """An experiments file that cannot be used, with the experiment and field named."""


def domain_bucket(unit: int | str) -> int:
    digest = hashlib.sha256(f"domain:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def in_ranges(bucket: int, ranges: tuple[tuple[float, float], ...]) -> bool:
    return any(round(start * BUCKETS) <= bucket < round(end * BUCKETS) for start, end in ranges)


def layer_bucket(salt: str, unit: int | str) -> int:
    digest = hashlib.sha256(f"layer:{salt}:{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


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
class Layer:
    """Experiments that change the same thing (the version of `model`) and so never share a unit."""

    name: str
    model: str
    salt: str
    description: str = ""
    domain: str = ""  # "" for the units outside every domain

    def bucket(self, unit: int | str) -> int:
        return layer_bucket(self.salt, unit)


@dataclass(frozen=True)
class Experiment:
    name: str
    model: str
    salt: str
    variants: tuple[Variant, ...]
    description: str = ""
    layer: str = ""  # "" for an experiment outside any layer
    layer_salt: str = ""
    slice: tuple[float, float] = WHOLE  # its share [start, end) of the layer's buckets
    domain: tuple[tuple[float, float], ...] = ()  # the ranges of the domain hash its layer sees; () all

    @property
    def traffic(self) -> float:
        """The share of all units in the experiment."""
        seen = sum(end - start for start, end in self.domain) if self.domain else 1.0
        return (self.slice[1] - self.slice[0]) * seen

    def bucket(self, unit: int | str) -> int:
        digest = hashlib.sha256(self.hash_prefix + str(unit).encode()).digest()
        return int.from_bytes(digest[:8], "big") % BUCKETS

    @cached_property
    def hash_prefix(self) -> bytes:
        """`salt:name:`, the part of the hashed `salt:name:unit` that every unit shares."""
        return f"{self.salt}:{self.name}:".encode()

    def includes(self, unit: int | str) -> bool:
        """Whether the unit falls in this experiment's slice of its layer (and in its layer's domain)."""
        if self.domain and not in_ranges(domain_bucket(unit), self.domain):
            return False
        return self.slice == WHOLE or self.holds(layer_bucket(self.layer_salt, unit))

    def holds(self, bucket: int) -> bool:
        """Whether a layer bucket falls in this experiment's slice."""
        start, end = self.slice_buckets
        return start <= bucket < end

    @cached_property
    def slice_buckets(self) -> tuple[int, int]:
        """The slice as layer buckets [start, end): computed once, every request asks."""
        start, end = self.slice
        return round(start * BUCKETS), round(end * BUCKETS)

    @cached_property
    def variant_ends(self) -> tuple[int, ...]:
        """Each variant's end in the experiment's buckets, cumulative over the variants in file order."""
        ends, upper = [], 0.0
        for variant in self.variants:
            upper += variant.traffic * BUCKETS
            ends.append(round(upper))
        return tuple(ends)

    def assign(self, unit: int | str) -> Variant | None:
        """The unit's variant, None when the unit is outside the experiment's slice of its layer: the
        same unit always gets the same answer."""
        return self.variant_of(unit) if self.includes(unit) else None

    def variant_of(self, unit: int | str) -> Variant:
        """The variant of a unit inside the slice, by the experiment's own hash."""
        bucket = self.bucket(unit)
        for variant, end in zip(self.variants, self.variant_ends):
            if bucket < end:
                return variant
        return self.variants[-1]


def included(experiments: tuple[Experiment, ...] | list[Experiment], unit: int | str) -> Iterator[Experiment]:
    """The experiments whose slice holds the unit, in file order; each layer's bucket is hashed once."""
    buckets: dict[str, int] = {}
    domain = None
    for experiment in experiments:
        if experiment.domain:
            domain = domain_bucket(unit) if domain is None else domain
            if not in_ranges(domain, experiment.domain):
                continue
        if experiment.slice == WHOLE:
            yield experiment
            continue
        salt = experiment.layer_salt
        if salt not in buckets:
            buckets[salt] = layer_bucket(salt, unit)
        if experiment.holds(buckets[salt]):
            yield experiment


def assignments(experiments: tuple[Experiment, ...] | list[Experiment], unit: int | str) -> dict[str, str]:
    """Experiment -> variant for every experiment that includes the unit (what the server logs)."""
    return {e.name: e.variant_of(unit).name for e in included(experiments, unit)}


def deciding(
    experiments: tuple[Experiment, ...] | list[Experiment], model: str, unit: int | str
) -> tuple[Experiment, Variant] | None:
    """The experiment that decides which version of `model` serves the unit, and its variant; None when
    no experiment on `model` includes the unit (the model's default serves). At most one can: in each
    domain the experiments on one model share a layer and their slices do not overlap (`parse`)."""
    for experiment in included([e for e in experiments if e.model == model], unit):
        return experiment, experiment.variant_of(unit)
    return None


def parse(raw: dict, source: str = "experiments") -> list[Experiment]:
    if not isinstance(raw, dict) or not isinstance(raw.get("experiments"), list):
        raise ExperimentConfigError(f"{source}: expected a mapping with a list under 'experiments'")
    domains = parse_domains(raw, source)
    layers = parse_layers(raw, source, domains)
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
        variants = parse_variants(entry, where)
        layer = placement(entry, where, layers)
        experiments.append(
            Experiment(
                name,
                str(entry["model"]),
                salt,
                variants,
                str(entry.get("description", "")),
                layer.name if layer else "",
                layer.salt if layer else "",
                parse_slice(entry, where) if layer else WHOLE,
                seen_by(layer.domain if layer else "", domains),
            )
        )
    check_layers(experiments, layers, source)
    return experiments


def parse_variants(entry: dict, where: str) -> tuple[Variant, ...]:
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
    return tuple(variants)


def parse_domains(raw: dict, source: str) -> dict[str, tuple[float, float]]:
    """Domain name -> its slice of the domain hash; the slices must not overlap."""
    entries = raw.get("domains") or []
    if not isinstance(entries, list):
        raise ExperimentConfigError(f"{source}: 'domains' must be a list")
    domains: dict[str, tuple[float, float]] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: domain #{i + 1} ({entry.get('name', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict) or not NAME.match(str(entry.get("name", ""))) or "slice" not in entry:
            raise ExperimentConfigError(f"{where}: needs a lower_snake_case name and a slice")
        if entry["name"] in domains:
            raise ExperimentConfigError(f"{where}: duplicate domain name {entry['name']!r}")
        start, end = parse_slice(entry, where, f"the domains' units (domain {entry['name']!r})")
        for other, (a, b) in domains.items():
            if round(start * BUCKETS) < round(b * BUCKETS) and round(a * BUCKETS) < round(end * BUCKETS):
                raise ExperimentConfigError(
                    f"{source}: domains {other!r} {[a, b]} and {entry['name']!r} {[start, end]} overlap; "
                    "domains must not share a unit"
                )
        domains[str(entry["name"])] = (start, end)
    return domains


def seen_by(domain: str, domains: dict[str, tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The ranges of the domain hash that a layer in `domain` sees ("": outside every domain; () for
    every unit when there are no domains)."""
    if domain:
        return (domains[domain],)
    if not domains:
        return ()
    gaps, start = [], 0.0
    for a, b in sorted(domains.values()):
        if a > start:
            gaps.append((start, a))
        start = max(start, b)
    if start < 1.0:
        gaps.append((start, 1.0))
    return tuple(gaps) or ((0.0, 0.0),)  # domains cover every unit: nothing is left outside them


def parse_layers(raw: dict, source: str, domains: dict[str, tuple[float, float]]) -> dict[str, Layer]:
    entries = raw.get("layers") or []
    if not isinstance(entries, list):
        raise ExperimentConfigError(f"{source}: 'layers' must be a list")
    layers: dict[str, Layer] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: layer #{i + 1} ({entry.get('name', '?') if isinstance(entry, dict) else '?'})"
        missing = [k for k in ("name", "model", "salt") if not isinstance(entry, dict) or not entry.get(k)]
        if missing:
            raise ExperimentConfigError(f"{where}: missing {', '.join(missing)}")
        layer = Layer(
            str(entry["name"]),
            str(entry["model"]),
            str(entry["salt"]),
            str(entry.get("description", "")),
            str(entry.get("domain") or ""),
        )
        if layer.domain and layer.domain not in domains:
            raise ExperimentConfigError(f"{where}: domain {layer.domain!r} is not declared under 'domains'")
        if not NAME.match(layer.name):
            raise ExperimentConfigError(f"{where}: name must be lower_snake_case")
        if layer.name in layers:
            raise ExperimentConfigError(f"{where}: duplicate layer name {layer.name!r}")
        same_salt = [other.name for other in layers.values() if other.salt == layer.salt]
        if same_salt:
            raise ExperimentConfigError(
                f"{where}: salt {layer.salt!r} is already used by layer {same_salt[0]!r}; "
                "layers sharing a salt would not overlap orthogonally"
            )
        layers[layer.name] = layer
    return layers


def placement(entry: dict, where: str, layers: dict[str, Layer]) -> Layer | None:
    """The experiment's layer (None outside any), checked against the experiment's model."""
    if not entry.get("layer"):
        if "slice" in entry:
            raise ExperimentConfigError(f"{where}: a slice needs a layer to take it from")
        return None
    layer = layers.get(str(entry["layer"]))
    if layer is None:
        raise ExperimentConfigError(f"{where}: layer {entry['layer']!r} is not declared under 'layers'")
    if str(entry["model"]) != layer.model:
        raise ExperimentConfigError(
            f"{where}: model {entry['model']!r} differs from layer {layer.name!r}'s model {layer.model!r}; "
            "a layer decides the version of one model"
        )
    return layer


def parse_slice(entry: dict, where: str, of: str = "") -> tuple[float, float]:
    bounds = entry.get("slice", list(WHOLE))
    try:
        start, end = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ExperimentConfigError(f"{where}: slice must be [start, end], got {bounds!r}") from None
    if not 0 <= start < end <= 1:
        raise ExperimentConfigError(
            f"{where}: slice [{start}, {end}] of {of or 'layer ' + repr(entry['layer'])} must lie within [0, 1] "
            f"with start < end (its traffic {end - start:g})"
        )
    if round(start * BUCKETS) == round(end * BUCKETS):
        raise ExperimentConfigError(f"{where}: slice [{start}, {end}] is narrower than one bucket in {BUCKETS}")
    return start, end


def check_layers(experiments: list[Experiment], layers: dict[str, Layer], source: str) -> None:
    """Refuse experiments in one layer whose slices overlap, and a model decided from two layers (an
    experiment outside any layer is a layer of its own): either would give a unit two experiments
    changing the same thing."""
    deciders: dict[tuple[str, str], list[str]] = {}
    for layer in layers.values():
        deciders.setdefault((layer.domain, layer.model), []).append(f"layer {layer.name!r}")
    for experiment in experiments:
        if not experiment.layer:
            who = f"experiment {experiment.name!r} (outside any layer)"
            deciders.setdefault(("", experiment.model), []).append(who)
    for (domain, model), who in deciders.items():
        if len(who) > 1:
            where = f" in domain {domain!r}" if domain else ""
            raise ExperimentConfigError(
                f"{source}: the version of model {model!r} is decided{where} by {' and by '.join(who)}; experiments "
                "that change the same thing must share one layer, each with its own slice of the layer's traffic"
            )
    for layer in layers.values():
        members = sorted((e for e in experiments if e.layer == layer.name), key=lambda e: e.slice)
        for before, after in zip(members, members[1:]):
            if round(after.slice[0] * BUCKETS) < round(before.slice[1] * BUCKETS):
                raise ExperimentConfigError(
                    f"{source}: layer {layer.name!r}: experiments {before.name!r} {list(before.slice)} and "
                    f"{after.name!r} {list(after.slice)} overlap; experiments in one layer must take disjoint "
                    f"slices of its traffic (its slices add up to {sum(e.slice[1] - e.slice[0] for e in members):g})"
                )


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
    layers: tuple[Layer, ...] = ()


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
    """Experiments, shadows and layers, all checked."""
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
    experiments = tuple(parse(raw, source))  # checks the layers too
    return ExperimentsFile(
        experiments,
        tuple(parse_shadows(raw, source)),
        tuple(parse_layers(raw, source, parse_domains(raw, source)).values()),
    )


@dataclass(frozen=True)
class Design:
    """What an experiment's analysis needs from the files that served it: its control (the first
    variant), its split (variant -> traffic), the digests of those files, and why they cannot be used
    ("" when they can): files that disagree on the control or the split, since pooling arms whose split
    changed while they ran compares users who entered at different times."""

    control: str
    split: dict[str, float]
    configs: tuple[str, ...]
    conflict: str = ""


REPOSITORY = "repository file"  # how a design names the file read for logs that predate recorded configs


def served_designs(
    uses: list[tuple[str, str | None]], configs: dict[str | None, tuple[Experiment, ...]]
) -> dict[str, Design]:
    """Each experiment's design from the files that routed its records (`uses`: pairs of experiment and
    the digest its records name; `configs`: digest -> that file's experiments, None -> the file read for
    records that name none). An experiment a file does not hold gets no design from that file."""
    seen: dict[str, dict[tuple, list[str]]] = {}
    for name, digest in sorted(set(uses), key=lambda use: (use[0], use[1] or "")):
        found = next((e for e in configs.get(digest, ()) if e.name == name), None)
        if found is not None:
            arms = tuple((v.name, v.traffic) for v in found.variants)
            seen.setdefault(name, {}).setdefault(arms, []).append(digest or REPOSITORY)
    designs = {}
    for name, versions in seen.items():
        arms, digests = next(iter(versions.items()))
        conflict = ""
        if len(versions) > 1:
            stated = "; ".join(
                f"{', '.join(f'{arm} {share:g}' for arm, share in split)} in {', '.join(where)}"
                for split, where in versions.items()
            )
            conflict = f"its control or split changed while it ran ({stated}): the arms cannot be pooled"
        every = tuple(d for where in versions.values() for d in where)
        designs[name] = Design(arms[0][0], dict(arms), every, conflict)
    return designs
