"""KServe manifests generated from the registry: an `InferenceService` per served model, running the
`serving/models` container as a custom predictor over a server config that pins the registry version
(a ConfigMap beside it), and one `InferenceService` for the Triton model repository (engines/models/model_export.py).
Plain Python, no Dagster.

Every manifest is validated against JSON Schemas of the Kubernetes objects (deploy/kserve/schema/, derived
from KServe's and Kubernetes' own generated models by scripts/vendor-kserve-schema): a field KServe's
v1beta1 InferenceService does not define, a wrong type or a missing required field fails the export.

Pinning the version (not the alias) makes a manifest a reproducible deployment: a promotion or rollback
writes a new manifest, and KServe rolls the predictor out to it (canaryTrafficPercent for a gradual one).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from engines.models.model_export import TRITON_REPOSITORY, ExportTarget

KSERVE_FOLDER = Path("deploy") / "kserve"  # under the lake root
SCHEMA_FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "kserve" / "schema"
SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-v1beta1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
}
# KServe's webhook: "lower case alphanumeric characters or '-', and must start with alphabetical character"
ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CONFIG_MOUNT = "/etc/mlplane"
PORT = 8080  # KServe routes a custom predictor's traffic to this port by default
LABEL = "mlplane.io"
TRITON_MANIFEST = "mlplane-triton.yaml"  # the Triton repository's InferenceService, beside one per served model


@dataclass(frozen=True)
class KServeSettings:
    image: str = "mlplane/models:0.1.0"  # the serving/models container (`mlplane serve models`)
    namespace: str = "mlplane"
    lake_pvc: str = "mlplane-lake"  # the PersistentVolumeClaim holding the lake (and the local registry)
    lake_mount: str = "/mnt/lake"
    min_replicas: int = 1
    max_replicas: int = 4
    cpu: str = "1"
    memory: str = "2Gi"
    triton_runtime_version: str | None = None  # the Triton image tag; None: the cluster's serving runtime's
    labels: dict[str, str] = field(default_factory=dict)


class ManifestError(ValueError):
    """A generated manifest that KServe or Kubernetes would reject."""


def isvc_name(model_name: str) -> str:
    name = "mlplane-" + re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    if len(name) > 63 or not ISVC_NAME.match(name):
        raise ManifestError(f"model {model_name!r} makes no valid InferenceService name ({name!r})")
    return name


def pod_server_config(server: dict, target: ExportTarget, lake_root: str, settings: KServeSettings) -> dict:
    """The model server's config (serving/models/config.py fields) for one served model at its pinned
    version, with the local lake's paths moved to where the pod mounts the lake."""

    def moved(value):
        if isinstance(value, str) and (value == lake_root or value.startswith(lake_root.rstrip("/") + "/")):
            return settings.lake_mount + value[len(lake_root.rstrip("/")) :]
        return value

    config = {k: moved(v) for k, v in server.items() if k != "models" and v is not None}
    config["workdir"] = "/tmp/mlplane-models"  # downloaded artifacts stay in the pod
    config["models"] = [
        {"name": target.name, "registry_model": target.registry_model, "kind": target.kind, "version": target.version}
    ]
    return config


def predictor_manifests(target: ExportTarget, server: dict, lake_root: str, settings: KServeSettings) -> list[dict]:
    """The ConfigMap with the server's config and the InferenceService running it."""
    name = isvc_name(target.name)
    labels = {f"{LABEL}/model": name, "app.kubernetes.io/part-of": "mlplane", **settings.labels}
    annotations = {
        f"{LABEL}/registry-model": target.registry_model,
        f"{LABEL}/registry-version": target.version,
        f"{LABEL}/follows": target.follows,
        f"{LABEL}/artifact-checksum": target.checksum,
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-server", "namespace": settings.namespace, "labels": labels},
        "data": {
            "server.yaml": yaml.safe_dump(pod_server_config(server, target, lake_root, settings), sort_keys=False)
        },
    }
    container = {
        "name": "kserve-container",
        "image": settings.image,
        "command": ["mlplane", "serve", "models"],
        "args": [
            "--config",
            f"{CONFIG_MOUNT}/server.yaml",
            "--host",
            "0.0.0.0",
            "--port",
            str(PORT),
            "--grpc-port",
            "0",
        ],
        "ports": [{"name": "http1", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": f"/v2/models/{target.name}/ready", "port": PORT}, "periodSeconds": 5},
        "resources": {
            "requests": {"cpu": settings.cpu, "memory": settings.memory},
            "limits": {"cpu": settings.cpu, "memory": settings.memory},
        },
        "volumeMounts": [
            {"name": "server-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "lake", "mountPath": settings.lake_mount},
        ],
    }
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels, "annotations": annotations},
        "spec": {
            "predictor": {
                "minReplicas": settings.min_replicas,
                "maxReplicas": settings.max_replicas,
                "containers": [container],
                "volumes": [
                    {"name": "server-config", "configMap": {"name": f"{name}-server"}},
                    {"name": "lake", "persistentVolumeClaim": {"claimName": settings.lake_pvc}},
                ],
            }
        },
    }
    return [config, isvc]


def triton_manifest(targets: list[ExportTarget], settings: KServeSettings) -> dict:
    """One InferenceService serving the exported repository with KServe's Triton runtime (Open Inference
    Protocol v2), its models' registry versions in an annotation."""
    model = {
        "modelFormat": {"name": "triton"},
        "protocolVersion": "v2",
        "storageUri": f"pvc://{settings.lake_pvc}/{TRITON_REPOSITORY.as_posix()}",
    }
    if settings.triton_runtime_version:
        model["runtimeVersion"] = settings.triton_runtime_version
    versions = {t.name: t.version for t in targets}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": "mlplane-triton",
            "namespace": settings.namespace,
            "labels": {"app.kubernetes.io/part-of": "mlplane", **settings.labels},
            "annotations": {f"{LABEL}/registry-versions": json.dumps(versions, sort_keys=True)},
        },
        "spec": {
            "predictor": {"minReplicas": settings.min_replicas, "maxReplicas": settings.max_replicas, "model": model}
        },
    }


@functools.cache
def _validator(api_version: str, kind: str):
    import jsonschema

    name = SCHEMAS.get((api_version, kind))
    if name is None:
        raise ManifestError(f"no schema for {kind} {api_version}: only {sorted(SCHEMAS)}")
    schema = json.loads((SCHEMA_FOLDER / name).read_text())
    return jsonschema.Draft202012Validator(schema)


def problems(manifest: dict) -> list[str]:
    """Every way `manifest` departs from its kind's schema (an empty list: none)."""
    try:
        validator = _validator(str(manifest.get("apiVersion")), str(manifest.get("kind")))
    except ManifestError as error:
        return [str(error)]
    found = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path)))
    ]
    name = manifest.get("metadata", {}).get("name", "")
    if manifest.get("kind") == "InferenceService" and not (ISVC_NAME.match(name) and len(name) <= 63):
        found.append(f"metadata.name: {name!r} is not a valid InferenceService name")
    return found


def deployment_manifests(
    targets: list[ExportTarget],
    triton_targets: list[ExportTarget],
    server: dict,
    lake_root: str,
    settings: KServeSettings,
) -> dict[str, list[dict]]:
    """file name -> documents: each served model's predictor, and the Triton repository's InferenceService
    over `triton_targets` (none: no Triton manifest, which a failed export leaves as it was)."""
    manifests = {f"{isvc_name(t.name)}.yaml": predictor_manifests(t, server, lake_root, settings) for t in targets}
    if triton_targets:
        manifests[TRITON_MANIFEST] = [triton_manifest(triton_targets, settings)]
    return manifests


def all_problems(manifests: dict[str, list[dict]]) -> dict[str, list[str]]:
    """`file[i]` -> its problems, for every document of `manifests` that has any."""
    return {f"{file}[{i}]": p for file, docs in manifests.items() for i, doc in enumerate(docs) if (p := problems(doc))}


def write_manifests(folder: Path, manifests: dict[str, list[dict]], keep: AbstractSet[str] = frozenset()) -> list[Path]:
    """Validate every manifest, then write one multi-document YAML per file name (the folder's other files
    go, but those named in `keep`: a model no longer served loses its manifest). Raises ManifestError before
    writing anything."""
    bad = all_problems(manifests)
    if bad:
        raise ManifestError("; ".join(f"{where}: {', '.join(p)}" for where, p in bad.items()))
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for file, docs in sorted(manifests.items()):
        path = folder / file
        tmp = path.with_name(f".{file}.tmp")
        tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        tmp.replace(path)
        written.append(path)
    for old in folder.glob("*.yaml"):
        if old not in written and old.name not in keep:
            old.unlink()
    return written
