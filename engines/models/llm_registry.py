"""Language models in the model registry: each trained LLM (the gateway's model, its draft model for
speculative decoding) is an MLflow version carrying its lineage (data partitions, tokenizer hash,
metrics), and a registry reference (`gateway_llm@champion`, `gateway_llm/3`) resolves to a local,
checksum-verified Hugging Face folder that vLLM serves. Plain Python, no Dagster."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from engines.models.registry import ModelRegistry, RegisteredVersion

TOKENIZER_TAG = "mlplane.tokenizer_sha256"
PARTITIONS_TAG = "mlplane.data_partitions"
TARGET_TAG = "mlplane.draft_for"  # a draft model's target: "<name>/<version>"
ROLE_TAG = "mlplane.llm_role"  # "target", "draft" or "vision"
REFERENCE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>\d+))$")


@dataclass(frozen=True)
class LlmLineage:
    """Where a trained LLM came from: the warehouse days it read per table, its tokenizer, the code and
    the run that made it."""

    partitions: dict[str, list[date]]
    tokenizer_sha256: str
    code_version: str
    produced_by: str  # e.g. "dagster run <id>, asset models/gateway_llm"
    role: str = "target"
    draft_for: str | None = None

    def tags(self) -> dict[str, str]:
        tags = {
            PARTITIONS_TAG: json.dumps(summarize_partitions(self.partitions), sort_keys=True),
            TOKENIZER_TAG: self.tokenizer_sha256,
            "mlplane.code_version": self.code_version,
            "mlplane.produced_by": self.produced_by,
            ROLE_TAG: self.role,
        }
        if self.draft_for:
            tags[TARGET_TAG] = self.draft_for
        return tags


def summarize_partitions(partitions: dict[str, list[date]]) -> dict[str, dict]:
    """Per table: first and last day, count, and a hash of the exact list (MLflow tags are short; the
    hash still tells two versions trained on different days apart)."""
    summary = {}
    for table, days in sorted(partitions.items()):
        listed = sorted(d.isoformat() for d in days)
        summary[table] = {
            "first": listed[0] if listed else None,
            "last": listed[-1] if listed else None,
            "days": len(listed),
            "sha256": hashlib.sha256(",".join(listed).encode()).hexdigest()[:16],
        }
    return summary


def register_llm(
    registry: ModelRegistry,
    name: str,
    model_dir: Path,
    lineage: LlmLineage,
    metrics: dict[str, float],
    params: dict[str, str] | None = None,
) -> RegisteredVersion:
    numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return registry.register(name, model_dir, lineage.tags(), numeric, params)


@dataclass(frozen=True)
class LlmReference:
    """`name@alias` or `name/version`."""

    name: str
    alias: str | None = None
    version: str | None = None

    @classmethod
    def parse(cls, text: str) -> LlmReference:
        match = REFERENCE.match(text.strip())
        if not match:
            raise ValueError(f"registry reference {text!r} must be NAME@ALIAS or NAME/VERSION")
        return cls(match["name"], match["alias"], match["version"])

    def __str__(self) -> str:
        return f"{self.name}@{self.alias}" if self.alias else f"{self.name}/{self.version}"


@dataclass(frozen=True)
class ResolvedLlm:
    reference: LlmReference
    version: RegisteredVersion
    path: Path

    @property
    def tokenizer_sha256(self) -> str | None:
        return self.version.tags.get(TOKENIZER_TAG)


def resolve_version(registry: ModelRegistry, reference: LlmReference) -> RegisteredVersion:
    if reference.alias:
        found = registry.by_alias(reference.name, reference.alias)
        if found is None:
            raise LookupError(f"registry model {reference.name!r} has no version with alias {reference.alias!r}")
        return found
    if reference.version is None:
        raise LookupError(f"registry reference {reference.name!r} names neither an alias nor a version")
    return registry.get(reference.name, reference.version)


def materialize_llm(registry: ModelRegistry, reference: LlmReference, cache_dir: Path) -> ResolvedLlm:
    """The version `reference` names, downloaded once into `cache_dir/<name>/v<version>` and verified
    against its registered checksums (a folder already there was verified when it was written)."""
    version = resolve_version(registry, reference)
    target = cache_dir / reference.name / f"v{version.version}"
    if not (target / "config.json").exists():
        staging = target.with_name(f".v{version.version}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        folder = registry.load(reference.name, version.version, staging)
        shutil.rmtree(target, ignore_errors=True)
        folder.rename(target)
        shutil.rmtree(staging, ignore_errors=True)
    return ResolvedLlm(reference, version, target)


def check_draft(target: ResolvedLlm, draft: ResolvedLlm) -> None:
    """A draft model must share its target's tokenizer (vLLM verifies draft tokens by id)."""
    if not target.tokenizer_sha256 or target.tokenizer_sha256 != draft.tokenizer_sha256:
        raise ValueError(
            f"draft {draft.reference} (v{draft.version.version}) does not share the tokenizer of "
            f"{target.reference} (v{target.version.version}): "
            f"{draft.tokenizer_sha256} != {target.tokenizer_sha256}"
        )
