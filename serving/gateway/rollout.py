"""`mlplane gateway rollout`: keeps the gateway's registry-backed deployments served. For each entry of
`deployments` in the gateway YAML it resolves the registry reference (`gateway_llm@champion`) to a
version, downloads it (checksums verified) and runs vLLM on it; the backends it runs are written into
the same file's `model_list` (marked with `deployment` and `registry_version`), which every gateway
replica reloads on its own.

A promotion (the alias moving) rolls the deployment without a failed request: start the new version's
servers and wait until they answer, add them beside the old ones (traffic is shared), remove the old
ones (traffic moves), wait until the old servers have nothing running or waiting, then stop them. A
request that still reaches a stopped server fails before its first byte and the gateway retries it on
another backend. A version that does not start leaves the old one serving, and is not retried until
the reference resolves to another version."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from engines.models.llm_registry import LlmReference, ResolvedLlm, check_draft, materialize_llm
from engines.models.registry import ModelRegistry
from serving.gateway.config import Deployment, GatewayConfig, load_config
from serving.gateway.vllm_process import DEFAULT_PYTHON, VllmProcess, speculative_config

log = logging.getLogger("mlplane.gateway.rollout")


@dataclass
class Served:
    """One deployment's running servers and the version they serve."""

    version: str  # "gateway_llm/3"
    model_dir: Path
    servers: list[VllmProcess]


class Rollout:
    def __init__(
        self,
        config_path: str | Path,
        registry: ModelRegistry,
        cache_dir: str | Path,
        gateways: tuple[str, ...] = (),
        admin_key: str | None = None,
        python: Path = DEFAULT_PYTHON,
        startup_timeout_s: float = 600,
        drain_timeout_s: float | None = None,
    ):
        self.config_path = Path(config_path)
        self.registry = registry
        self.cache_dir = Path(cache_dir)
        self.gateways, self.admin_key = gateways, admin_key
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.served: dict[str, Served] = {}
        self.pending: list[VllmProcess] = []  # started, not yet serving: close() stops them too
        self.failed: dict[str, str] = {}  # deployment -> the version that would not start
        self.events: list[dict] = []
        self.state_file = self.cache_dir / "rollout_state.json"
        self._adopt()

    @property
    def config(self) -> GatewayConfig:
        return load_config(self.config_path)

    # --- the loop ---------------------------------------------------------------------------
    def step(self) -> list[dict]:
        """Brings every deployment to the version its reference names now; returns what it did. New
        servers of all deployments start together, then each deployment switches once its are ready."""
        done, launched = [], []
        config = self.config
        wanted = {d.name for d in config.deployments}
        for name in [n for n in self.served if n not in wanted]:  # deployment removed from the file
            done.append(self._retire(name, config))
        for deployment in config.deployments:
            try:
                target, draft = self._resolve(deployment)
            except (LookupError, ValueError, OSError) as error:
                log.error("deployment %s: %s", deployment.name, error)
                done.append(self._event(deployment.name, "unresolved", error=str(error)))
                continue
            version = f"{target.reference.name}/{target.version.version}"
            current = self.served.get(deployment.name)
            if current is not None and current.version == version or self.failed.get(deployment.name) == version:
                continue
            servers = [self._server(deployment, target, draft, i) for i in range(deployment.replicas)]
            self.pending += servers
            launched.append((deployment, Served(version, target.path, servers)))
        try:
            for deployment, new in launched:
                done.append(self._switch(deployment, new, config))
        finally:
            self.pending.clear()
        return done

    def run_forever(self, poll_s: float = 5.0) -> None:
        while True:
            self.step()
            time.sleep(poll_s)

    def close(self, stop_servers: bool = True) -> None:
        """Stops the servers it runs (or leaves them for the next controller to adopt)."""
        for server in self.pending:
            server.stop()
        if not stop_servers:
            return
        for served in self.served.values():
            for server in served.servers:
                server.stop()
        self.served.clear()
        self._save()

    # --- rolling ----------------------------------------------------------------------------
    def _resolve(self, deployment: Deployment) -> tuple[ResolvedLlm, ResolvedLlm | None]:
        target = materialize_llm(self.registry, LlmReference.parse(deployment.registry), self.cache_dir)
        draft = None
        speculative = deployment.speculative
        if speculative and speculative.method == "draft_model" and speculative.draft is not None:  # validated
            draft = materialize_llm(self.registry, LlmReference.parse(speculative.draft), self.cache_dir)
            check_draft(target, draft)
        return target, draft

    def _switch(self, deployment: Deployment, new: Served, config: GatewayConfig) -> dict:
        old = self.served.get(deployment.name)
        started = time.perf_counter()
        try:
            for server in new.servers:
                server.wait_ready(self.startup_timeout_s)
        except RuntimeError as error:
            for server in new.servers:
                server.stop()
            self.failed[deployment.name] = new.version
            log.error(
                "deployment %s: %s did not start; %s keeps serving: %s",
                deployment.name,
                new.version,
                old.version if old else "nothing",
                error,
            )
            return self._event(deployment.name, "failed", version=new.version, error=str(error)[-2000:])
        self.failed.pop(deployment.name, None)
        self.served[deployment.name] = new
        self._publish(config, {deployment.name: (old.servers if old else []) + new.servers})  # both serve
        self._publish(config)  # only the new version
        if old is not None:
            self._stop(old, config)
        self._save()
        log.info("deployment %s now serves %s (was %s)", deployment.name, new.version, old.version if old else "-")
        return self._event(
            deployment.name,
            "rolled",
            version=new.version,
            previous=old.version if old else None,
            seconds=round(time.perf_counter() - started, 1),
            urls=[s.url for s in new.servers],
        )

    def _retire(self, name: str, config: GatewayConfig) -> dict:
        old = self.served.pop(name)
        self._publish(config)
        self._stop(old, config)
        self._save()
        return self._event(name, "retired", previous=old.version)

    def _stop(self, old: Served, config: GatewayConfig) -> None:
        timeout = self.drain_timeout_s or config.settings.request_timeout_s
        for server in old.servers:
            if not server.drain(timeout):
                log.warning("%s still busy after %.0f s: stopping it anyway", server.url, timeout)
            server.stop()

    def _server(
        self, deployment: Deployment, target: ResolvedLlm, draft: ResolvedLlm | None, replica: int
    ) -> VllmProcess:
        args = list(deployment.vllm_args)
        spec = deployment.speculative
        if spec is not None:
            args += [
                "--speculative-config",
                speculative_config(
                    spec.method,
                    spec.num_speculative_tokens,
                    draft.path if draft else None,
                    spec.prompt_lookup_max,
                    spec.prompt_lookup_min,
                ),
            ]
        logs = self.cache_dir / "logs"
        label = f"{deployment.name}-v{target.version.version}-{replica}".replace("@", "-").replace("/", "-")
        return VllmProcess(target.path, deployment.model_name, logs / f"{label}.log", args, python=self.python).start()

    # --- the gateway file -------------------------------------------------------------------
    def _publish(self, config: GatewayConfig, override: dict[str, list[VllmProcess]] | None = None) -> None:
        """Rewrites model_list: entries of other origin stay as they are, each deployment's are its
        running servers (or `override`'s); then waits until the gateways serve it."""
        raw = yaml.safe_load(self.config_path.read_text()) or {}
        deployments = {d.name: d for d in config.deployments}
        kept = [e for e in raw.get("model_list") or [] if not (isinstance(e, dict) and e.get("deployment"))]
        managed = []
        for name, served in self.served.items():
            deployment = deployments.get(name)
            if deployment is None:
                continue
            for server in (override or {}).get(name, served.servers):
                version = self._version_of(server)
                managed.append(
                    {
                        "model_name": deployment.model_name,
                        "url": server.url,
                        "model": deployment.model_name,
                        "region": deployment.region,
                        "weight": deployment.weight,
                        "capacity": deployment.capacity,
                        "max_tokens": deployment.max_tokens,
                        "tokenizer": str(server.model_dir),
                        "vision": deployment.vision,
                        "deployment": name,
                        "registry_version": version,
                    }
                )
        raw["model_list"] = kept + managed
        tmp = self.config_path.with_suffix(".rollout.tmp")
        tmp.write_text(yaml.safe_dump(raw, sort_keys=False))
        tmp.replace(self.config_path)  # atomic: a gateway never reads half a file
        self._wait_reloaded(config)

    def _version_of(self, server: VllmProcess) -> str:
        for served in self.served.values():
            if server in served.servers:
                return served.version
        name, version = server.model_dir.parent.name, server.model_dir.name.removeprefix("v")
        return f"{name}/{version}"

    def _wait_reloaded(self, config: GatewayConfig) -> None:
        """Asks each known gateway to reload now; without any, waits out their file watch."""
        if not self.gateways:
            time.sleep(2 * config.settings.reload_interval_s + 0.2)
            return
        for url in self.gateways:
            response = httpx.post(
                f"{url.rstrip('/')}/admin/reload", timeout=30, headers={"Authorization": f"Bearer {self.admin_key}"}
            )
            if response.status_code != 200:
                raise RuntimeError(f"gateway {url} refused the reload: {response.status_code} {response.text[:300]}")

    # --- state across restarts --------------------------------------------------------------
    def _save(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        state = {
            name: {
                "version": s.version,
                "model_dir": str(s.model_dir),
                "servers": [
                    {"pid": v.pid, "port": v.port, "log": str(v.log), "served_name": v.served_name} for v in s.servers
                ],
            }
            for name, s in self.served.items()
        }
        self.state_file.write_text(json.dumps(state, indent=2))

    def _adopt(self) -> None:
        """Servers a previous controller left running (and still answering) are adopted, not restarted."""
        if not self.state_file.exists():
            return
        for name, entry in json.loads(self.state_file.read_text()).items():
            servers = [
                VllmProcess(
                    Path(entry["model_dir"]),
                    s["served_name"],
                    Path(s["log"]),
                    port=s["port"],
                    python=self.python,
                    pid=s["pid"],
                )
                for s in entry["servers"]
            ]
            if servers and all(s.alive() and _healthy(s.url) for s in servers):
                self.served[name] = Served(entry["version"], Path(entry["model_dir"]), servers)

    def _event(self, deployment: str, action: str, **fields) -> dict:
        event = {"deployment": deployment, "action": action, "at": time.time(), **fields}
        self.events.append(event)
        return event


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def registry_from(root: str | None, tracking_uri: str | None) -> ModelRegistry:
    if tracking_uri:
        return ModelRegistry(tracking_uri)
    if not root:
        raise ValueError("name the model registry with --registry-root or --tracking-uri")
    return ModelRegistry.local(Path(root))


def admin_key_of(config: GatewayConfig) -> str | None:
    return os.environ.get(config.settings.admin_key_env)
