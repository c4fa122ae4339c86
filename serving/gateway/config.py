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

A string value may name environment variables, `${NAME}` or `${NAME:-default}`: deployments keep their
addresses and secrets out of the file (deploy/prod/gateway.yaml); an unset one without a default is refused.

Both levels are strict pydantic models: a wrongly typed value (`max_attempts: "3"`) or an unknown
field is refused with a message naming it, at start and at reload (which then keeps the running file).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

BACKEND_KINDS = ("openai", "v2")
STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the entry and the field."""


class BackendSpec(BaseModel):
    model_config = STRICT

    model_name: str = Field(min_length=1)
    url: str = Field(min_length=1)
    model: str = ""
    region: str = "default"
    weight: float = Field(default=1.0, gt=0)
    capacity: int = Field(default=32, gt=0)
    kind: Literal["openai", "v2"] = "openai"
    tokenizer: str | None = None
    max_tokens: int = Field(default=256, gt=0)
    vision: bool = False  # accepts image_url parts (serving/gateway/images.py)
    # set by `mlplane gateway rollout` on the backends it runs: the deployment and registry version
    deployment: str | None = None
    registry_version: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, values):
        if isinstance(values, dict) and isinstance(values.get("url"), str):
            values = {**values, "url": values["url"].rstrip("/")}
            if not values.get("model"):
                values["model"] = values.get("model_name")
        return values

    @property
    def id(self) -> str:
        return f"{self.model_name}@{self.url}#{self.model}"


class Settings(BaseModel):
    model_config = STRICT

    store: str = "sqlite:///data/gateway/gateway.db"
    # usage records the store refuses wait here (files) until it answers again; replayed at start too
    usage_spill_dir: str = "data/gateway/usage_spill"
    rate_limits: str = "memory"
    rate_limit_prefix: str = "mlplane:gateway"
    # what a request meets while the rate-limit Redis is unreachable: "closed" answers 503 (nothing is
    # admitted unmetered), "open" admits it unmetered and logs a warning
    rate_limit_failure: Literal["closed", "open"] = "closed"
    redis_timeout_s: float = Field(default=0.5, gt=0)
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    max_json_depth: int = Field(default=32, gt=1)
    # image_url parts (data URLs only): decoded bytes per image, images per request, pixels per image
    max_image_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_images: int = Field(default=8, ge=0)
    max_image_pixels: int = Field(default=4096 * 4096, gt=0)
    # the most a backend may go silent once its answer has begun (a stream may run longer in all)
    request_timeout_s: float = Field(default=120.0, gt=0)
    # the most a backend may take to begin its answer (status line): one that accepts a request and never
    # answers is cut here and the request moves to another backend. A non-streamed completion begins
    # when its generation ends, so this bounds the longest non-streamed generation too
    first_byte_timeout_s: float = Field(default=60.0, gt=0)
    # on SIGTERM the gateway stops accepting and finishes what it admitted for at most this long, then
    # ends what is left (each request still gets its usage record, status 499)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    health_interval_s: float = Field(default=5.0, gt=0)
    circuit_failures: int = Field(default=3, gt=0)
    circuit_open_s: float = Field(default=10.0, ge=0)
    # failures in a row of one key that count toward a backend's shared circuit; past circuit_failures
    # the key gets a circuit of its own there
    key_failure_budget: int = Field(default=1, gt=0)
    spill_factor: float = Field(default=2.0, ge=1)
    max_attempts: int = Field(default=3, gt=0)
    admin_key_env: str = "MLPLANE_GATEWAY_ADMIN_KEY"
    key_cache_s: float = Field(default=2.0, ge=0)
    # revocations, rotations and team limits are polled this often, so they hold on every replica
    # within about this time whatever key_cache_s is
    key_watch_s: float = Field(default=0.5, gt=0, le=1.0)
    reload_interval_s: float = Field(default=1.0, gt=0)
    # anonymous /metrics shows only aggregate counters; backend URLs and model names need the admin key
    public_metrics: bool = False

    @field_validator("rate_limits")
    @classmethod
    def _limiter(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"must be 'memory' or a redis:// URL, not {value!r}")
        return value


class Speculation(BaseModel):
    """vLLM speculative decoding for a deployment: a registered draft model or prompt n-grams."""

    model_config = STRICT

    method: Literal["draft_model", "ngram"]
    draft: str | None = None  # registry reference of the draft model (draft_model only)
    num_speculative_tokens: int = Field(default=3, gt=0, le=16)
    prompt_lookup_max: int = Field(default=3, gt=0)
    prompt_lookup_min: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _draft(self):
        if (self.method == "draft_model") != (self.draft is not None):
            raise ValueError("'draft' (a registry reference) is needed with method draft_model, and only there")
        return self


class Deployment(BaseModel):
    """A model group served from a registry version: `mlplane gateway rollout` resolves `registry`
    (NAME@ALIAS or NAME/VERSION) to a local folder, runs vLLM on it and keeps this file's model_list
    pointing at the running backends, rolling them when the alias moves."""

    model_config = STRICT

    model_name: str = Field(min_length=1)
    registry: str = Field(pattern=r"^[A-Za-z0-9_.-]+(@[A-Za-z0-9_-]+|/\d+)$")
    name: str = ""  # unique; default model_name@region
    region: str = "default"
    replicas: int = Field(default=1, gt=0)
    weight: float = Field(default=1.0, gt=0)
    capacity: int = Field(default=32, gt=0)
    max_tokens: int = Field(default=256, gt=0)
    vision: bool = False
    speculative: Speculation | None = None
    vllm_args: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _name(cls, values):
        if isinstance(values, dict) and not values.get("name") and isinstance(values.get("model_name"), str):
            values = {**values, "name": f"{values['model_name']}@{values.get('region', 'default')}"}
        return values


class GatewayConfig(BaseModel):
    model_config = STRICT

    model_list: tuple[BackendSpec, ...] = ()
    deployments: tuple[Deployment, ...] = ()
    settings: Settings = Field(default_factory=Settings)

    @field_validator("model_list", "deployments", mode="before")
    @classmethod
    def _list(cls, value):
        if not isinstance(value, list | tuple):
            raise ValueError("must be a list")
        return tuple(value)

    @model_validator(mode="after")
    def _unique(self):
        if not self.model_list and not self.deployments:
            raise ValueError("model_list must name at least one backend (or deployments one model)")
        names = [d.name for d in self.deployments]
        if len(set(names)) != len(names):
            raise ValueError(f"deployments named twice: {sorted({n for n in names if names.count(n) > 1})}")
        ids = [b.id for b in self.model_list]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"backends listed twice: {duplicates}")
        for name, specs in self.groups.items():
            if len({s.kind for s in specs}) > 1:
                raise ValueError(f"model {name!r} mixes backend kinds")
        return self

    @property
    def backends(self) -> tuple[BackendSpec, ...]:
        return self.model_list

    @property
    def groups(self) -> dict[str, list[BackendSpec]]:
        groups: dict[str, list[BackendSpec]] = {}
        for backend in self.model_list:
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


ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_environment(raw, missing: set[str]):
    """`raw` with `${NAME}` / `${NAME:-default}` in its strings replaced; unset names go to `missing`."""
    if isinstance(raw, dict):
        return {key: expand_environment(value, missing) for key, value in raw.items()}
    if isinstance(raw, list):
        return [expand_environment(value, missing) for value in raw]
    if not isinstance(raw, str):
        return raw

    def value_of(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        value = os.environ.get(name) or default
        if value is None:
            missing.add(name)
            return ""
        return value

    return ENV_REFERENCE.sub(value_of, raw)


def parse_config(raw, source: str = "config") -> GatewayConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with model_list and settings")
    missing: set[str] = set()
    raw = expand_environment(raw, missing)
    if missing:
        raise ConfigError(f"{source} names unset environment variables: set {', '.join(sorted(missing))}")
    try:
        return GatewayConfig.model_validate({**raw, "settings": raw.get("settings") or {}})
    except ValidationError as error:
        raise ConfigError(f"{source}: {describe(error)}") from error


def describe(error: ValidationError) -> str:
    """'model_list[0].urll: Extra inputs are not permitted; settings.max_attempts: ...'"""
    return "; ".join(f"{location(e['loc'])}: {e['msg']}" for e in error.errors())


def location(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"
