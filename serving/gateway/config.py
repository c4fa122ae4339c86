"""The gateway's one YAML file. Entries of `model_list` that share a public `model_name` form a group
served by several backends (LiteLLM's layout, flattened):

    model_list:
      - model_name: chat-small            # the name clients ask for
        url: http://10.0.0.5:8000         # the backend's base URL (OpenAI routes under /v1)
        model: /models/gateway_llm        # the backend's own name for it (default: model_name)
        region: eu-west
        weight: 2                         # relative share among equally fast backends
        capacity: 16                      # requests in flight before it counts as full
        tokenizer: /models/gateway_llm    # folder or tokenizer.json for exact prompt counts
        max_tokens: 256                   # completion cap assumed when a request names none
    settings:
      store: sqlite:///data/gateway/gateway.db   # or postgresql://... (keys and usage)
      rate_limits: memory                         # or redis://host:6379/0 (shared by replicas)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

BACKEND_KINDS = ("openai", "v2")


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the entry and the field."""


@dataclass(frozen=True)
class BackendSpec:
    model_name: str
    url: str
    model: str
    region: str = "default"
    weight: float = 1.0
    capacity: int = 32
    kind: str = "openai"
    tokenizer: str | None = None
    max_tokens: int = 256

    @property
    def id(self) -> str:
        return f"{self.model_name}@{self.url}#{self.model}"


@dataclass(frozen=True)
class Settings:
    store: str = "sqlite:///data/gateway/gateway.db"
    rate_limits: str = "memory"
    rate_limit_prefix: str = "mlplane:gateway"
    max_body_bytes: int = 1_048_576
    request_timeout_s: float = 120.0
    connect_timeout_s: float = 2.0
    health_interval_s: float = 5.0
    circuit_failures: int = 3
    circuit_open_s: float = 10.0
    spill_factor: float = 2.0
    max_attempts: int = 3
    admin_key_env: str = "MLPLANE_GATEWAY_ADMIN_KEY"
    key_cache_s: float = 2.0
    reload_interval_s: float = 1.0


@dataclass(frozen=True)
class GatewayConfig:
    backends: tuple[BackendSpec, ...]
    settings: Settings = field(default_factory=Settings)

    @property
    def groups(self) -> dict[str, list[BackendSpec]]:
        groups: dict[str, list[BackendSpec]] = {}
        for backend in self.backends:
            groups.setdefault(backend.model_name, []).append(backend)
        return groups

    @property
    def admin_key(self) -> str | None:
        return os.environ.get(self.settings.admin_key_env) or None


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"gateway config {path} not found") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"gateway config {path} is not valid YAML: {error}") from error
    return parse_config(raw or {}, source=str(path))


def parse_config(raw: dict, source: str = "config") -> GatewayConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with model_list and settings")
    unknown = set(raw) - {"model_list", "settings"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {sorted(unknown)}")
    entries = raw.get("model_list") or []
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: model_list must be a non-empty list")
    backends = tuple(_backend(entry, f"{source}: model_list[{i}]") for i, entry in enumerate(entries))
    ids = [b.id for b in backends]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigError(f"{source}: backends listed twice: {duplicates}")
    settings_raw = raw.get("settings") or {}
    known = set(Settings.__dataclass_fields__)
    unknown = set(settings_raw) - known
    if unknown:
        raise ConfigError(f"{source}: unknown settings {sorted(unknown)}; known: {sorted(known)}")
    return GatewayConfig(backends=backends, settings=Settings(**settings_raw))


def _backend(entry: dict, where: str) -> BackendSpec:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a mapping")
    known = set(BackendSpec.__dataclass_fields__)
    unknown = set(entry) - known
    if unknown:
        raise ConfigError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
    for required in ("model_name", "url"):
        if not entry.get(required):
            raise ConfigError(f"{where}: {required} is required")
    values = {**entry, "model": entry.get("model") or entry["model_name"], "url": str(entry["url"]).rstrip("/")}
    spec = BackendSpec(**values)
    if spec.kind not in BACKEND_KINDS:
        raise ConfigError(f"{where}: kind must be one of {BACKEND_KINDS}, not {spec.kind!r}")
    if spec.weight <= 0 or spec.capacity <= 0:
        raise ConfigError(f"{where}: weight and capacity must be positive")
    return spec
