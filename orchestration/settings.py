"""Every environment variable mlplane reads, in one typed list: what it means, what each profile does
without it, and how a value is checked. docs/operations.md's settings table is generated from it
(`python -m orchestration.settings` rewrites the table) and `mlplane doctor` checks the environment
against it."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

REQUIRED = "required"
# A check gets the value and the whole environment (a setting may depend on another); it returns what is
# wrong with the value, or None.
Check = Callable[[str, Mapping[str, str]], str | None]


def any_text(value: str, env: Mapping[str, str]) -> str | None:
    return None


def url(*schemes: str) -> Check:
    def check(value: str, env: Mapping[str, str]) -> str | None:
        scheme = value.split("://", 1)[0] if "://" in value else None
        if scheme in schemes:
            return None
        wanted = " or ".join(f"{s}://" for s in schemes)
        return f"{value!r} is not a {wanted} URL"

    return check


def server_url(*schemes: str) -> Check:
    """A service's URL; a folder only where MLPLANE_ALLOW_EMBEDDED allows an embedded engine."""
    as_url = url(*schemes)

    def check(value: str, env: Mapping[str, str]) -> str | None:
        if "://" not in value and is_true(env.get("MLPLANE_ALLOW_EMBEDDED", "")):
            return None
        problem = as_url(value, env)
        if problem and "://" not in value:
            return f"{problem}: a folder embeds a one-process engine, which needs MLPLANE_ALLOW_EMBEDDED=1"
        return problem

    return check


def host_port(value: str, env: Mapping[str, str]) -> str | None:
    if re.fullmatch(r"[\w.-]+:\d+(,.*)?", value):
        return None
    return f"{value!r} is not host:port (Feast's Redis connection string, e.g. redis.internal:6379)"


def ray_address(value: str, env: Mapping[str, str]) -> str | None:
    if value == "auto" or value.startswith("ray://") or re.fullmatch(r"[\w.-]+:\d+", value):
        return None
    return f"{value!r} is not ray://host:10001, host:6379 or auto"


def positive_integer(value: str, env: Mapping[str, str]) -> str | None:
    return None if value.isdigit() and int(value) > 0 else f"{value!r} is not a positive whole number"


def flag(value: str, env: Mapping[str, str]) -> str | None:
    return None if value.strip().lower() in ("", "0", "1", "true", "false", "yes", "no") else f"{value!r} is not 0/1"


def is_true(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes")


def folder(value: str, env: Mapping[str, str]) -> str | None:
    return None if Path(value).is_dir() else f"{value!r} is not an existing folder (a mount every host sees)"


def outside_checkout(value: str, env: Mapping[str, str]) -> str | None:
    path, checkout = Path(value).resolve(), Path(__file__).resolve().parents[1]
    if path == checkout or checkout in path.parents:
        return f"{value!r} is inside the checkout: give storage every host shares"
    return None if Path(value).is_absolute() else f"{value!r} is not an absolute path"


def artifact_root(value: str, env: Mapping[str, str]) -> str | None:
    """An s3:// bucket (any S3-compatible store, MLFLOW_S3_ENDPOINT_URL names one that is not AWS) or a
    folder every host mounts."""
    if value.startswith("s3://"):
        return None if value[len("s3://") :].split("/", 1)[0] else f"{value!r} names no bucket"
    if "://" in value:
        return f"{value!r} is neither an s3:// URL nor a folder"
    return outside_checkout(value, env)


def existing_file(value: str, env: Mapping[str, str]) -> str | None:
    return None if Path(value).is_file() else f"{value!r} is not a file"


def dagster_home(value: str, env: Mapping[str, str]) -> str | None:
    # the local profile's CLI links the project's dagster.yaml into a home without one
    if env.get("MLPLANE_PROFILE", "local") != "prod" or (Path(value) / "dagster.yaml").is_file():
        return None
    return f"{value!r} holds no dagster.yaml (use deploy/prod, or a copy of its dagster.yaml)"


def profile_name(value: str, env: Mapping[str, str]) -> str | None:
    return None if value in ("local", "prod") else f"{value!r} is not local or prod"


@dataclass(frozen=True)
class Setting:
    """One variable. `local` and `prod` say what that profile does without it: a default, REQUIRED, or
    None where the profile does not read it (a command's or service's own setting: `used_by`)."""

    name: str
    meaning: str
    local: str | None
    prod: str | None
    check: Check = any_text
    used_by: str = "runs, sensors and the mlplane CLI"

    def required(self, profile: str) -> bool:
        return self.in_profile(profile) == REQUIRED

    def in_profile(self, profile: str) -> str | None:
        return {"local": self.local, "prod": self.prod}[profile]

    def problem(self, env: Mapping[str, str], profile: str) -> str | None:
        """What is wrong with this setting in `env` for `profile`, or None."""
        value = env.get(self.name, "")
        if not value:
            return f"{self.name} is not set: {self.meaning}" if self.required(profile) else None
        if self.in_profile(profile) is None:
            return None
        problem = self.check(value, env)
        return f"{self.name}: {problem}" if problem else None


NOTIFY_PREFIX = "MLPLANE_NOTIFY_"
SQL_SCHEMES = ("postgresql", "postgresql+psycopg2")
SETTINGS = (
    Setting(
        "MLPLANE_PROFILE",
        "Which resources runs use: local (embedded) or prod",
        "local (the default)",
        "prod",
        profile_name,
    ),
    Setting(
        "DAGSTER_HOME",
        "Folder of the Dagster instance's dagster.yaml (prod: deploy/prod, storage in PostgreSQL)",
        ".dagster_home/ (made by mlplane)",
        REQUIRED,
        dagster_home,
    ),
    Setting(
        "MLPLANE_DAGSTER_PG_URL",
        "Dagster's run, event-log and schedule storage (postgresql+psycopg2://user:pw@host:5432/dagster)",
        None,
        REQUIRED,
        url("postgresql+psycopg2"),
        used_by="deploy/prod/dagster.yaml",
    ),
    Setting(
        "MLPLANE_COMPUTE_LOGS_DIR",
        "Steps' stdout and stderr, outside the checkout, shared by run workers and the webserver",
        None,
        REQUIRED,
        outside_checkout,
        used_by="deploy/prod/dagster.yaml",
    ),
    Setting(
        "MLPLANE_DAGSTER_STORAGE_DIR",
        "Dagster's local artifact storage (run artifacts), outside the checkout",
        None,
        REQUIRED,
        outside_checkout,
        used_by="deploy/prod/dagster.yaml",
    ),
    Setting("MLPLANE_DATA_DIR", "The lake's root: a mount every host sees", "./data", REQUIRED, folder),
    Setting("MLPLANE_REDIS_URL", "Feast's online store (Redis host:port)", None, REQUIRED, host_port),
    Setting("MLPLANE_FEAST_REGISTRY_URL", "Feast's SQL registry (SQLAlchemy URL)", None, REQUIRED, url(*SQL_SCHEMES)),
    Setting(
        "MLPLANE_WEBHOOK_URL",
        "Webhook for failed runs and streaming jobs; unset, they show in the Dagster UI only",
        "optional",
        "optional (a warning at start)",
        url("http", "https"),
    ),
    Setting(
        f"{NOTIFY_PREFIX}<TARGET>",
        "Webhook of a target pipelines name in notify= (MLPLANE_NOTIFY_ML_ONCALL is ml-oncall)",
        "optional",
        "optional",
        url("http", "https"),
    ),
    Setting(
        "MLPLANE_QDRANT_URL",
        "The Qdrant server of item vectors (http(s)://host:6333)",
        "vectors/ in the lake (embedded)",
        REQUIRED,
        server_url("http", "https"),
    ),
    Setting(
        "MLPLANE_ALLOW_EMBEDDED",
        "1: prod may embed an engine where a setting names a folder (MLPLANE_QDRANT_URL)",
        None,
        "0",
        flag,
    ),
    Setting("MLPLANE_RAY_ADDRESS", "The Ray cluster to join", "in-process Ray", REQUIRED, ray_address),
    Setting(
        "MLPLANE_FLINK_REST_URL",
        "The Flink session cluster's JobManager REST address (streaming jobs and their backfill)",
        "PyFlink mini-cluster",
        REQUIRED,
        url("http", "https"),
    ),
    Setting(
        "MLPLANE_KAFKA_BOOTSTRAP_SERVERS",
        "Kafka brokers the streaming jobs read (a topic per event source: mlplane.interactions, ...)",
        "files under stream/ in the lake",
        REQUIRED,
    ),
    Setting(
        "MLPLANE_FEAST_TYPECHECKS",
        "1: Feast's classes checked by typeguard at every call, instrumented at import (seconds per process)",
        "0",
        "0",
        flag,
        "every process that imports Feast",
    ),
    Setting(
        "MLPLANE_STREAMING_SLIDE_SECONDS",
        "How often the live streaming windows emit",
        "60",
        None,
        positive_integer,
    ),
    Setting(
        "MLPLANE_MLFLOW_TRACKING_URI",
        "MLflow's tracking and registry store (an MLflow server or postgresql+psycopg2:// database)",
        "registry/mlflow.db in the lake",
        REQUIRED,
        url("http", "https", *SQL_SCHEMES),
    ),
    Setting(
        "MLPLANE_MLFLOW_ARTIFACT_ROOT",
        "Where new model versions store their artifacts: s3://bucket/prefix, or a folder every host mounts",
        "registry/ in the lake",
        REQUIRED,
        artifact_root,
    ),
    Setting(
        "MLFLOW_S3_ENDPOINT_URL",
        "The S3-compatible object store of s3:// artifact roots (MinIO, Ceph, ...); MLflow's own variable",
        None,
        "AWS S3 when unset",
        url("http", "https"),
        used_by="MLflow (boto3) in runs and the model server",
    ),
    Setting(
        "AWS_ACCESS_KEY_ID",
        "The object store's access key (boto3's own variable)",
        None,
        "boto3's other credential sources",
        used_by="MLflow (boto3) in runs and the model server",
    ),
    Setting(
        "AWS_SECRET_ACCESS_KEY",
        "The object store's secret key (boto3's own variable)",
        None,
        "boto3's other credential sources",
        used_by="MLflow (boto3) in runs and the model server",
    ),
    Setting(
        "MLPLANE_GATEWAY_URL", "The ML gateway assets call", "http://127.0.0.1:4000", REQUIRED, url("http", "https")
    ),
    Setting("MLPLANE_GATEWAY_KEY", "The service key assets call the gateway with", "optional", REQUIRED),
    Setting(
        "MLPLANE_LABELS_DB_URL",
        "The ground-truth label store the labeling app serves (SQLAlchemy URL)",
        "ground_truth/labels.db in the lake",
        REQUIRED,
        url(*SQL_SCHEMES),
    ),
    Setting(
        "MLPLANE_MODEL_SERVER_URL",
        "The online model server (REST); unset in prod, the export sensor skips",
        "http://127.0.0.1:8500",
        REQUIRED,
        url("http", "https"),
    ),
    Setting(
        "MLPLANE_MODEL_SERVER_CONFIG",
        "The model server's YAML: what it serves, read by the KServe/Triton export",
        "the local server's default",
        "the local server's default",
        existing_file,
    ),
    Setting(
        "MLPLANE_MODEL_SERVER_ADMIN_KEY",
        "The model server's admin key: repository load and unload need it (unset: they are refused)",
        None,
        None,
        used_by="mlplane serve models, the model-server resource",
    ),
    Setting(
        "MLPLANE_MODEL_SERVER_KEY",
        "The model server's data-plane key: when set, inference calls need it or the admin key",
        None,
        None,
        used_by="mlplane serve models, the model-server resource",
    ),
    Setting(
        "MLPLANE_EXPERIMENTS",
        "A/B experiments file of the model server",
        None,
        None,
        used_by="mlplane serve models",
    ),
    Setting(
        "MLPLANE_GATEWAY_ADMIN_KEY",
        "The gateway's admin key (keys, usage, reloads)",
        None,
        None,
        used_by="mlplane gateway serve",
    ),
    Setting("MLPLANE_GATEWAY_CONFIG", "The gateway's YAML", None, None, used_by="mlplane gateway"),
    Setting(
        "MLPLANE_GATEWAY_DB_URL",
        "The gateway's key and usage database (postgresql://...)",
        None,
        None,
        used_by="deploy/prod/gateway.yaml",
    ),
    Setting(
        "MLPLANE_GATEWAY_REDIS_URL",
        "The rate-limit counters every gateway replica shares (redis://host:6379/0)",
        None,
        None,
        used_by="deploy/prod/gateway.yaml",
    ),
    Setting(
        "MLPLANE_GATEWAY_TOKENIZER",
        "Folder (or tokenizer.json) of the gateway LLM's tokenizer, for exact prompt counts",
        None,
        None,
        used_by="deploy/prod/gateway.yaml",
    ),
    Setting("MLPLANE_GATEWAY_STORE", "The gateway's key and usage store", None, None, used_by="mlplane gateway"),
    Setting(
        "MLPLANE_REGISTRY_ROOT",
        "Local registry folder the LLM rollout reads",
        None,
        None,
        used_by="mlplane gateway rollout",
    ),
    Setting(
        "PGPASSWORD",
        "Password of database URLs written without one (libpq's own variable): the model server's YAML",
        None,
        None,
        used_by="the model server (deploy/k8s)",
    ),
    Setting(
        "MLPLANE_LABELING_PASSWORD",
        "Password of accounts the labeling commands create",
        None,
        None,
        used_by="mlplane labeling",
    ),
)


def declared(name: str) -> bool:
    """Whether `name` is one of SETTINGS (MLPLANE_NOTIFY_* included)."""
    return name.startswith(NOTIFY_PREFIX) or any(s.name == name for s in SETTINGS)


def problems(env: Mapping[str, str], profile: str) -> list[str]:
    """Every missing or malformed setting of `profile` in `env`, one sentence each."""
    found = [p for s in SETTINGS if not s.name.startswith(NOTIFY_PREFIX) and (p := s.problem(env, profile))]
    notify = next(s for s in SETTINGS if s.name.startswith(NOTIFY_PREFIX))
    for name, value in sorted(env.items()):
        if name.startswith(NOTIFY_PREFIX) and value and (problem := notify.check(value, env)):
            found.append(f"{name}: {problem}")
    return found


def notes(env: Mapping[str, str], profile: str) -> list[str]:
    """The optional settings of prod left unset (what then goes unnoticed), one sentence each."""
    if profile != "prod":
        return []
    return [
        f"{s.name} is not set (optional): {s.meaning}"
        for s in SETTINGS
        if (s.in_profile(profile) or "").startswith("optional")
        and not s.name.startswith(NOTIFY_PREFIX)
        and not env.get(s.name)
    ]


# --- beyond the values' form: can the services be reached, does the gateway's config start -------------
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "postgresql+psycopg2": 5432, "redis": 6379, "ray": 10001}


def endpoint(value: str) -> tuple[str, int] | None:
    """The host and port a URL or host:port value names (the first of a list), or None (a folder, s3://)."""
    if "://" in value:
        parsed = urlsplit(value)
        if parsed.scheme not in DEFAULT_PORTS or not parsed.hostname:
            return None
        return parsed.hostname, parsed.port or DEFAULT_PORTS[parsed.scheme]
    match = re.fullmatch(r"([\w.-]+):(\d+)", value.split(",")[0].strip())
    return (match[1], int(match[2])) if match else None


def unreachable(env: Mapping[str, str], profile: str, timeout_s: float = 3.0) -> list[str]:
    """The settings of `profile` in `env` naming a host and port that takes no TCP connection, one sentence each."""
    found = []
    for setting in SETTINGS:
        value = env.get(setting.name, "")
        target = endpoint(value) if value and setting.in_profile(profile) is not None else None
        if target is None:
            continue
        try:
            socket.create_connection(target, timeout=timeout_s).close()
        except OSError as error:
            found.append(f"{setting.name}: cannot reach {target[0]}:{target[1]} ({error.strerror or error})")
    return found


def gateway_config_problems(path: str) -> list[str]:
    """What stops the gateway from starting on the config at `path`: unset variables it names, invalid
    fields, tokenizers that are not there."""
    from serving.gateway.config import ConfigError, load_config

    try:
        config = load_config(path)
    except ConfigError as error:
        return [str(error)]
    return [
        f"{path}: the tokenizer {backend.tokenizer!r} of {backend.model_name} ({backend.region}) does not exist"
        for backend in config.model_list
        if backend.tokenizer and not Path(backend.tokenizer).exists()
    ]


# --- docs/operations.md ------------------------------------------------------------------------------
DOCS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
TABLE_START, TABLE_END = "<!-- settings table: begin -->", "<!-- settings table: end -->"


def settings_table() -> str:
    """The Markdown table of SETTINGS, as docs/operations.md holds it."""
    rows = ["| Variable | Meaning | local | prod | Read by |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        cells = [f"`{s.name}`", s.meaning, s.local or "-", s.prod or "-", s.used_by]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def with_table(page: str) -> str:
    start, end = page.index(TABLE_START) + len(TABLE_START), page.index(TABLE_END)
    return f"{page[:start]}\n{settings_table()}\n{page[end:]}"


if __name__ == "__main__":
    DOCS.write_text(with_table(DOCS.read_text()))
    print(f"wrote the settings table of {DOCS}")
