"""Deployment exports of the served models, regenerated whenever a served version changes (a promotion,
a rollback, a new CLIP): the Triton model repository and the KServe manifests, both in the lake under
`deploy/` (they follow the registry, so they are generated, not committed; deploy/kserve/schema/ in the
checkout holds what they are validated against). The `model_export_sensor` (orchestration/sensors.py)
watches the registry's aliases and runs this asset when one moves."""

import shutil
import tempfile
from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, Config, MaterializeResult, asset
from pydantic import Field

from assets.metadata import table
from assets.serving import CLIP_REGISTERED
from engines.models import kserve
from engines.models.kinds import EXPORTED_KINDS
from engines.models.kserve import TRITON_MANIFEST
from engines.models.model_export import TRITON_REPOSITORY, ExportTarget, TritonModel, export_target, publish
from engines.models.registry import CHECKSUM_TAG, ModelRegistry
from resources.lake import LakeResource
from resources.model_server import ModelServerResource
from resources.registry import ModelRegistryResource

MODEL_EXPORT = AssetKey(["deploy", "model_export"])
TRITON_CHECK = "triton_export_matches_registry"
KSERVE_CHECK = "kserve_manifests_valid"


class ModelExportConfig(Config):
    server_config: str | None = Field(
        default=None, description="The model server's YAML; default: the model_server resource's, else the local server"
    )
    image: str = Field(default=kserve.KServeSettings.image, description="The serving/models container image")
    namespace: str = kserve.KServeSettings.namespace
    lake_pvc: str = Field(default=kserve.KServeSettings.lake_pvc, description="PVC holding the lake in the cluster")
    lake_mount: str = kserve.KServeSettings.lake_mount
    min_replicas: int = kserve.KServeSettings.min_replicas
    max_replicas: int = kserve.KServeSettings.max_replicas
    cpu: str = kserve.KServeSettings.cpu
    memory: str = kserve.KServeSettings.memory
    triton_runtime_version: str | None = None

    def settings(self) -> kserve.KServeSettings:
        fields = kserve.KServeSettings.__dataclass_fields__
        return kserve.KServeSettings(**{k: v for k, v in self.model_dump().items() if k in fields})


def server_config(path: str | None, lake_root: Path):
    """The model server's configuration: what it serves is what gets exported."""
    from serving.models.config import ServerConfig

    return ServerConfig.from_yaml(path) if path else ServerConfig.local(lake_root)


def resolve_targets(entries, registry: ModelRegistry) -> tuple[list[ExportTarget], list[str]]:
    """Each served model at the registry version it serves now; the ones with nothing to serve, and why."""
    targets, skipped = [], []
    for entry in entries:
        found = (
            registry.get(entry.registry_model, entry.version)
            if entry.version
            else registry.by_alias(entry.registry_model, entry.alias)
        )
        if found is None:
            skipped.append(f"{entry.name}: {entry.registry_model!r} has no {entry.alias!r} alias")
            continue
        targets.append(
            ExportTarget(
                entry.name,
                entry.registry_model,
                entry.kind,
                found.version,
                entry.follows,
                found.tags.get(CHECKSUM_TAG, ""),
            )
        )
    return targets, skipped


def served_versions(path: str | None, lake_root: Path, registry: ModelRegistry) -> dict[str, str]:
    """name -> registry version of every served model (the sensor's view of what the export follows)."""
    targets, _ = resolve_targets(server_config(path, lake_root).models, registry)
    return {t.name: t.version for t in targets}


@asset(
    key=MODEL_EXPORT,
    group_name="serving",
    deps=[AssetKey(["models", "personalization_champion"]), CLIP_REGISTERED],
    kinds={"kubernetes", "pytorch"},
    owners=["team:ml-platform"],
    tags={"domain": "serving"},
    description="The served models exported for KServe and Triton: a Triton model repository (TorchScript of the "
    "personalization towers and CLIP encoders with config.pbtxt, versions pinned to the registry's) "
    "and a KServe InferenceService per served model (the serving/models container as a custom "
    "predictor) plus one for the Triton repository, under deploy/ in the lake.",
    check_specs=[
        AssetCheckSpec(
            TRITON_CHECK,
            asset=MODEL_EXPORT,
            blocking=True,
            description="Each exported model, loaded with torch.jit as Triton's libtorch "
            "backend loads it and fed as its config.pbtxt declares, gives the "
            "served registry model's outputs on the same random inputs",
        ),
        AssetCheckSpec(
            KSERVE_CHECK,
            asset=MODEL_EXPORT,
            blocking=True,
            description="Every manifest validates against KServe's v1beta1 InferenceService "
            "(and core v1 ConfigMap) fields",
        ),
    ],
)
def model_export(
    context,
    config: ModelExportConfig,
    lake: LakeResource,
    model_registry: ModelRegistryResource,
    model_server: ModelServerResource,
):
    root = lake.get_client().root
    server = server_config(config.server_config or model_server.config_path, root)
    registry = model_registry.get_client()
    targets, skipped = resolve_targets(server.models, registry)
    repository = root / TRITON_REPOSITORY
    models, comparisons, published = export_triton(targets, registry, repository)
    exported_ok = all(c.passed for c in comparisons)
    settings = config.settings()
    # a failed export leaves Triton's manifest as it was, like its repository
    triton_targets = [m.target for m in models] if exported_ok else []
    manifests = kserve.deployment_manifests(
        targets, triton_targets, server.model_dump(mode="json"), str(root), settings
    )
    problems = kserve.all_problems(manifests)
    keep = set() if exported_ok else {TRITON_MANIFEST}
    written = kserve.write_manifests(root / kserve.KSERVE_FOLDER, manifests, keep) if not problems else []
    yield MaterializeResult(
        metadata={
            "served_models": table([served_model_row(t, models) for t in targets]),
            "skipped": "; ".join(skipped) or "none",
            "triton_repository": str(repository),
            "triton_published": ", ".join(f"{k}: {len(v)}" for k, v in published.items()) or "nothing (check failed)",
            "kserve_manifests": ", ".join(p.name for p in written) or "none written (invalid)",
        }
    )
    yield AssetCheckResult(
        check_name=TRITON_CHECK,
        passed=exported_ok,
        severity=AssetCheckSeverity.ERROR,
        description=None
        if exported_ok
        else "an export differs from its registry model; the live repository was left as it was",
        metadata={"comparisons": table([c.row() for c in comparisons])},
    )
    yield AssetCheckResult(
        check_name=KSERVE_CHECK,
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "documents": sum(len(d) for d in manifests.values()),
            "problems": table([{"document": k, "problem": "; ".join(v)} for k, v in problems.items()]),
        },
    )


def export_triton(targets: list[ExportTarget], registry: ModelRegistry, repository: Path):
    """Export the Triton-served targets into a staging folder, compare each export with its registry model,
    and publish the staging folder to `repository` only when every comparison passes. The exported models,
    the comparisons and what was published (nothing when one failed)."""
    from serving.models.export_check import compare_export

    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_parent(repository)))
    try:
        models: list[TritonModel] = []
        comparisons = []
        with tempfile.TemporaryDirectory(prefix="model-export-") as work:
            for target in (t for t in targets if t.kind in EXPORTED_KINDS):
                folder = registry.load(target.registry_model, target.version, Path(work) / target.name)
                exported = export_target(target, folder, staging)
                comparisons += [compare_export(staging, m, folder) for m in exported]
                models += exported
        published = publish(staging, repository, models) if all(c.passed for c in comparisons) else {}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return models, comparisons, published


def served_model_row(target: ExportTarget, models: list[TritonModel]) -> dict:
    """A served model in the metadata's table: its registry version and what serves it."""
    return {
        "served_as": target.name,
        "registry_model": target.registry_model,
        "version": target.version,
        "follows": target.follows,
        "triton_models": ", ".join(m.name for m in models if m.target == target) or "-",
        "inference_service": kserve.isvc_name(target.name),
    }


def _parent(repository: Path) -> Path:
    repository.parent.mkdir(parents=True, exist_ok=True)
    return repository.parent


model_export_assets = [model_export]
