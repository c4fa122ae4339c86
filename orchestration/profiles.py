"""The resource set of each profile. `MLPLANE_PROFILE=local` (default) runs everything embedded
on one machine; `prod` points the same code at shared services."""

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from dagster import DagsterInvalidConfigError, EnvVar

from resources.feature_store import FeatureStoreResource
from resources.flink import FlinkResource
from resources.gateway import GatewayResource
from resources.labels import LabelStoreResource
from resources.lake import LakeResource
from resources.model_server import ModelServerResource
from resources.notifications import WebhookNotifier
from resources.quality import QualityResource
from resources.ray import RayResource
from resources.registry import ModelRegistryResource
from resources.vector_store import VectorStoreResource

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("local", "prod")


def current_profile() -> str:
    profile = EnvVar("MLPLANE_PROFILE").get_value("local")
    if profile not in PROFILES:
        raise ValueError(f"MLPLANE_PROFILE must be one of {', '.join(PROFILES)}, not {profile!r}")
    return profile


def local_data_dir() -> str:
    return os.environ.get("MLPLANE_DATA_DIR", str(PROJECT_ROOT / "data"))


def notify_targets() -> dict[str, str]:
    """Named webhooks for pipelines' `notify=`: MLPLANE_NOTIFY_ML_ONCALL=https://... is target `ml-oncall`."""
    prefix = "MLPLANE_NOTIFY_"
    return {
        name[len(prefix) :].lower().replace("_", "-"): url
        for name, url in os.environ.items()
        if name.startswith(prefix) and url
    }


def embedded_allowed() -> bool:
    """MLPLANE_ALLOW_EMBEDDED=1: prod may use an embedded engine where a setting names a folder, not a server."""
    return os.environ.get("MLPLANE_ALLOW_EMBEDDED", "").strip().lower() in ("1", "true", "yes")


def notifier() -> WebhookNotifier:
    """Optional targets, read here rather than as EnvVars: an unset one must not fail the sensors' ticks."""
    return WebhookNotifier(url=os.environ.get("MLPLANE_WEBHOOK_URL"), targets=notify_targets())


_warned: set[str] = set()


def warn_about_unset_notifications(profile: str) -> None:
    """Once per process (the code location's start): in prod, failures without a webhook reach only the UI."""
    if profile == "prod" and not os.environ.get("MLPLANE_WEBHOOK_URL") and "webhook" not in _warned:
        _warned.add("webhook")
        logging.getLogger("mlplane").warning(
            "MLPLANE_WEBHOOK_URL is not set: failed runs and streaming jobs are shown in the Dagster UI only"
        )


def resources_for(profile: str, data_dir: str | None = None) -> dict:
    """The resources of a profile; `data_dir` overrides the lake root (tests, one-off runs)."""
    if profile == "local":
        lake = LakeResource(root=data_dir or local_data_dir())
        feature_store = FeatureStoreResource(lake=lake, online_store="sqlite")
        vector_store = VectorStoreResource(location=str(Path(lake.root) / "vectors"))
        ray_compute = RayResource()
        # the live job's slide; the streaming history and the training join follow it
        flink = FlinkResource(
            feature_store=feature_store, slide_seconds=int(os.environ.get("MLPLANE_STREAMING_SLIDE_SECONDS", "60"))
        )
        model_registry = ModelRegistryResource(root=str(Path(lake.root) / "registry"))
        gateway = GatewayResource(
            url=os.environ.get("MLPLANE_GATEWAY_URL", "http://127.0.0.1:4000"),
            api_key=os.environ.get("MLPLANE_GATEWAY_KEY"),
        )
        labels = LabelStoreResource(lake=lake)
        # `mlplane serve models` on localhost
        model_server = ModelServerResource(config_path=os.environ.get("MLPLANE_MODEL_SERVER_CONFIG"))
    elif profile == "prod":
        lake = LakeResource(root=data_dir or EnvVar("MLPLANE_DATA_DIR"))
        feature_store = FeatureStoreResource(
            lake=lake,
            online_store="redis",
            redis_url=EnvVar("MLPLANE_REDIS_URL"),
            registry_url=EnvVar("MLPLANE_FEAST_REGISTRY_URL"),
        )
        vector_store = VectorStoreResource(location=EnvVar("MLPLANE_QDRANT_URL"), allow_embedded=embedded_allowed())
        ray_compute = RayResource(address=EnvVar("MLPLANE_RAY_ADDRESS"))
        # read when the streaming jobs are used (a clear error then if unset), so a deployment
        # without streaming features needs none of them
        flink = FlinkResource(
            feature_store=feature_store,
            mode="cluster",
            source="kafka",
            kafka_bootstrap_servers=os.environ.get("MLPLANE_KAFKA_BOOTSTRAP_SERVERS", ""),
            rest_url=os.environ.get("MLPLANE_FLINK_REST_URL", ""),
            state_backend="rocksdb",  # a cluster's jobs run for months: state beyond any heap
        )
        model_registry = ModelRegistryResource(
            tracking_uri=EnvVar("MLPLANE_MLFLOW_TRACKING_URI"), artifact_root=EnvVar("MLPLANE_MLFLOW_ARTIFACT_ROOT")
        )
        gateway = GatewayResource(url=EnvVar("MLPLANE_GATEWAY_URL"), api_key=EnvVar("MLPLANE_GATEWAY_KEY"))
        labels = LabelStoreResource(lake=lake, url=EnvVar("MLPLANE_LABELS_DB_URL"))
        # read here, not as an EnvVar: unset, the export sensor skips instead of failing every tick
        model_server = ModelServerResource(
            url=os.environ.get("MLPLANE_MODEL_SERVER_URL"), config_path=os.environ.get("MLPLANE_MODEL_SERVER_CONFIG")
        )
    else:
        raise ValueError(f"unknown profile {profile!r}")
    return {
        "lake": lake,
        "feature_store": feature_store,
        "quality": QualityResource(lake=lake),
        "notifier": notifier(),
        "vector_store": vector_store,
        "ray": ray_compute,
        "flink": flink,
        "model_registry": model_registry,
        "gateway": gateway,
        "labels": labels,
        "model_server": model_server,
    }


@contextmanager
def open_resource(name: str, data_dir: str | None = None) -> Iterator:
    """One resource of the current profile, configured as in a run (its EnvVars read), for the CLIs."""
    profile = current_profile()
    try:
        with resources_for(profile, data_dir)[name].process_config_and_initialize_cm() as resource:
            yield resource
    except DagsterInvalidConfigError as error:
        unset = sorted(set(re.findall(r'environment variable "([^"]+)" which is not set', str(error))))
        problem = f"set {', '.join(unset)}" if unset else "; ".join(e.message.splitlines()[0] for e in error.errors)
        raise click.ClickException(f"the {profile} profile's {name} resource needs configuration: {problem}") from error
