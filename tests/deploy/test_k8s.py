"""deploy/k8s: the prod overlay renders (tests/deploy/kustomize.py), every object is valid against the
Kubernetes API's JSON schemas (vendored by the kubernetes-validate package), every variable a container
gets is a declared setting, the code location gets every required prod setting, and probes, Services and
commands point at what the images really serve. No cluster runs here: this is what can be checked
without one."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from fastapi import FastAPI

from orchestration.profiles import PROJECT_ROOT
from orchestration.settings import SETTINGS, declared
from serving.models.config import ServerConfig
from tests.deploy.kustomize import render

PROD = PROJECT_ROOT / "deploy" / "k8s" / "overlays" / "prod"
KUBERNETES_VERSION = "1.32.0"
# the settings checked by looking at the filesystem: in a pod they must be mounted volumes instead
MOUNTED = {"MLPLANE_DATA_DIR", "MLPLANE_COMPUTE_LOGS_DIR", "MLPLANE_DAGSTER_STORAGE_DIR"}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render(PROD)


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def pod(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def environment(container: dict, objects: list[dict]) -> dict[str, str | None]:
    """The variables a container gets: a literal value, a ConfigMap value, or None for a Secret's."""
    config_maps = by_kind(objects, "ConfigMap")
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]]["data"])
    for variable in container.get("env", []):
        reference = variable.get("valueFrom", {})
        if "configMapKeyRef" in reference:
            ref = reference["configMapKeyRef"]
            env[variable["name"]] = config_maps[ref["name"]]["data"][ref["key"]]
        elif "secretKeyRef" in reference:
            assert reference["secretKeyRef"]["key"] == variable["name"], "a Secret's key is its variable's name"
            env[variable["name"]] = None
        else:
            env[variable["name"]] = variable["value"]
    return env


def test_the_prod_overlay_renders_the_six_units(objects):
    assert sorted(by_kind(objects, "Deployment")) == [
        "mlplane-code-location",
        "mlplane-dagster-daemon",
        "mlplane-dagster-webserver",
        "mlplane-gateway",
        "mlplane-labeling",
        "mlplane-model-server",
    ]
    assert {obj["metadata"]["namespace"] for obj in objects} == {"mlplane"}
    images = {c["image"] for d in by_kind(objects, "Deployment").values() for c in pod(d)["containers"]}
    assert all(image.startswith("registry.example.com/mlplane/") and image.endswith(":0.1.0") for image in images)
    assert by_kind(objects, "Deployment")["mlplane-gateway"]["spec"]["replicas"] == 3


def test_every_object_is_valid_against_the_kubernetes_schemas(objects):
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_schemas_catch_a_malformed_object(objects):
    deployment = yaml.safe_load(yaml.safe_dump(by_kind(objects, "Deployment")["mlplane-gateway"]))
    pod(deployment)["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_every_variable_the_manifests_set_is_a_declared_setting(objects):
    for deployment in by_kind(objects, "Deployment").values():
        for container in pod(deployment)["containers"]:
            names = environment(container, objects)
            assert sorted(name for name in names if not declared(name)) == [], deployment["metadata"]["name"]


def test_the_code_location_gets_every_required_prod_setting(objects):
    container = pod(by_kind(objects, "Deployment")["mlplane-code-location"])["containers"][0]
    env = environment(container, objects)
    assert env["MLPLANE_PROFILE"] == "prod"
    required = [s for s in SETTINGS if s.required("prod")]
    assert sorted(s.name for s in required if s.name not in env) == []
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    for setting in required:
        value = env[setting.name]
        if setting.name in MOUNTED:
            assert any(value == m or value.startswith(m + "/") for m in mounts), f"{setting.name} is on no volume"
        elif value is not None and setting.name != "DAGSTER_HOME":
            assert setting.problem({**env, setting.name: value}, "prod") is None
    assert f"ENV DAGSTER_HOME={env['DAGSTER_HOME']}" in (PROJECT_ROOT / "deploy/images/Dockerfile").read_text()


def test_the_dagster_pods_share_the_instance_settings(objects):
    deployments = by_kind(objects, "Deployment")
    instance = ("DAGSTER_HOME", "MLPLANE_DAGSTER_PG_URL", "MLPLANE_COMPUTE_LOGS_DIR", "MLPLANE_DAGSTER_STORAGE_DIR")
    for name in ("mlplane-code-location", "mlplane-dagster-webserver", "mlplane-dagster-daemon"):
        env = environment(pod(deployments[name])["containers"][0], objects)
        assert all(variable in env for variable in instance), name


def test_services_select_a_deployment_and_name_its_ports(objects):
    deployments = by_kind(objects, "Deployment").values()
    for service in by_kind(objects, "Service").values():
        selector = service["spec"]["selector"]
        chosen = [d for d in deployments if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(chosen) == 1, service["metadata"]["name"]
        ports = {p["name"] for c in pod(chosen[0])["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_volumes_and_config_maps_that_pods_use_exist(objects):
    claims, config_maps = by_kind(objects, "PersistentVolumeClaim"), by_kind(objects, "ConfigMap")
    for deployment in by_kind(objects, "Deployment").values():
        for volume in pod(deployment)["volumes"]:
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps


def test_the_model_server_config_is_a_valid_server_config(objects):
    config_map = by_kind(objects, "ConfigMap")["model-server-config"]
    config = ServerConfig.model_validate(yaml.safe_load(config_map["data"]["server.yaml"]))
    container = pod(by_kind(objects, "Deployment")["mlplane-model-server"])["containers"][0]
    assert environment(container, objects)["MLPLANE_MODEL_SERVER_CONFIG"].endswith("/server.yaml")
    assert config.tracking_uri and config.vector_store.startswith("http")
    assert {m.name for m in config.models} == {m.name for m in ServerConfig.local("/lake").models}


def served_paths(tmp_path: Path) -> dict[str, set[str]]:
    """The routes each unit's server really has, read from the apps themselves."""
    from dagster import instance_for_test
    from dagster_webserver.webserver import DagsterWebserver

    from ground_truth.app import create_app as labeling_app
    from orchestration.dagster_internals import EmptyWorkspaceTarget, WorkspaceProcessContext
    from serving.gateway.routes.ops import router as gateway_ops
    from serving.models.protocols.app import _health_routes

    model_server = FastAPI()
    _health_routes(model_server, server=None)  # registers the routes only; nothing is served here
    labeling = labeling_app(f"sqlite:///{tmp_path}/labels.db", tmp_path)
    with instance_for_test() as instance, WorkspaceProcessContext(instance, EmptyWorkspaceTarget()) as context:
        webserver = DagsterWebserver(context).create_asgi_app()
    return {
        "mlplane-model-server": {r.path for r in model_server.routes},
        "mlplane-gateway": {r.path for r in gateway_ops.routes},
        "mlplane-labeling": {r.path for r in labeling.routes},
        "mlplane-dagster-webserver": {getattr(r, "path", "") for r in webserver.routes},
    }


def test_http_probes_ask_for_routes_the_servers_have(objects, tmp_path):
    paths = served_paths(tmp_path)
    probed = set()
    for name, deployment in by_kind(objects, "Deployment").items():
        for container in pod(deployment)["containers"]:
            ports = {p["name"] for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                if "httpGet" in container.get(probe, {}):
                    get = container[probe]["httpGet"]
                    assert get["path"] in paths[name] and get["port"] in ports, (name, probe)
                    probed.add(name)
    assert probed == set(paths)


def click_command(program: str):
    """The click command behind a console script the images install."""
    from dagster_webserver.cli import cli as dagster_webserver

    from cli.main import main as mlplane
    from orchestration.dagster_internals import dagster_cli as dagster
    from orchestration.dagster_internals import dagster_daemon_cli as dagster_daemon

    commands = {"dagster": dagster, "dagster-daemon": dagster_daemon, "dagster-webserver": dagster_webserver}
    return {**commands, "mlplane": mlplane}[program]


def commands(objects: list[dict]) -> list[list[str]]:
    found = []
    for deployment in by_kind(objects, "Deployment").values():
        for container in pod(deployment)["containers"]:
            found.append(container["args"])
            found += [
                container[p]["exec"]["command"]
                for p in ("readinessProbe", "livenessProbe")
                if "exec" in container.get(p, {})
            ]
    return found


def test_containers_and_exec_probes_run_real_commands_with_real_options(objects):
    checked = commands(objects)
    assert len(checked) == 9  # six containers, three exec probes
    for command in checked:
        result = CliRunner().invoke(click_command(command[0]), [*command[1:], "--help"])
        assert result.exit_code == 0, (command, result.output)


def test_an_unknown_option_fails_that_check():
    result = CliRunner().invoke(click_command("mlplane"), ["labeling", "serve", "--no-such-option", "--help"])
    assert result.exit_code != 0


def test_the_gateway_pod_sets_every_variable_its_config_names(objects):
    from serving.gateway.config import ENV_REFERENCE

    container = pod(by_kind(objects, "Deployment")["mlplane-gateway"])["containers"][0]
    config = container["args"][container["args"].index("--config") + 1]
    named = {m[1] for m in ENV_REFERENCE.finditer((PROJECT_ROOT / config).read_text()) if m[2] is None}
    assert named and named <= set(environment(container, objects))
    tokenizer = environment(container, objects)["MLPLANE_GATEWAY_TOKENIZER"]
    assert any(tokenizer.startswith(m["mountPath"] + "/") for m in container["volumeMounts"])


def test_the_model_server_reads_the_mounted_config(objects):
    deployment = by_kind(objects, "Deployment")["mlplane-model-server"]
    container = pod(deployment)["containers"][0]
    config = Path(environment(container, objects)["MLPLANE_MODEL_SERVER_CONFIG"])
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent)]
    [volume] = [v for v in pod(deployment)["volumes"] if v["name"] == mount["name"]]
    assert config.name in by_kind(objects, "ConfigMap")[volume["configMap"]["name"]]["data"]
