"""deploy/images/Dockerfile, checked without a Docker daemon (none runs here): every COPY source is in
the build context, each deployable unit has a target whose command is a real console script with real
options and matches what its Kubernetes Deployment runs, the base image is pinned and the units run as
an unprivileged user."""

from __future__ import annotations

import fnmatch
import json
import re
from importlib.metadata import entry_points

from click.testing import CliRunner

from orchestration.profiles import PROJECT_ROOT
from tests.deploy.kustomize import render
from tests.deploy.test_k8s import PROD, by_kind, click_command, pod

DOCKERFILE = PROJECT_ROOT / "deploy" / "images" / "Dockerfile"
IGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")
TARGETS = {"code-location", "model-server", "gateway", "labeling"}


def stages() -> dict[str, list[str]]:
    """Each stage's instructions (continuation lines joined), by stage name."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            current = line.split(" AS ")[-1].strip()
            found[current] = []
        if current and line and not line.startswith("#"):
            found[current].append(line)
    return found


def ignored(path: str) -> bool:
    """Whether the .dockerignore keeps `path` out of the context (`**/` also matches at the root)."""
    patterns = [p for p in IGNORE.read_text().splitlines() if p and not p.startswith("#")]
    patterns += [p.removeprefix("**/") for p in patterns if p.startswith("**/")]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, p) for p in patterns for prefix in prefixes)


def test_every_copy_source_is_in_the_build_context():
    copies = [line.split()[1:-1] for lines in stages().values() for line in lines if line.startswith("COPY ")]
    assert len(copies) > 10
    for sources in copies:
        for source in sources:
            assert (PROJECT_ROOT / source).exists() and not ignored(source.rstrip("/")), source


def test_the_build_context_sends_no_environments_or_data():
    assert all(ignored(path) for path in (".venv", ".venv-flink", "data", ".git", "tests"))
    assert not any(ignored(path) for path in ("orchestration", "jobs", "deploy", "constraints.txt"))


def test_the_base_image_is_pinned_and_the_environment_is_installed_from_the_constraints():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11\.\d+-slim-\w+$", text, re.M)
    installs = re.findall(r"pip install[^\n]*", re.sub(r"\\\n\s*", " ", text))
    assert installs and all("--constraint constraints.txt" in line for line in installs)


def command_of(lines: list[str]) -> list[str]:
    [cmd] = [line for line in lines if line.startswith("CMD ")]
    return json.loads(cmd[len("CMD ") :])


def test_each_unit_runs_as_mlplane_a_real_command_its_deployment_also_runs():
    found = stages()
    assert TARGETS <= set(found)
    scripts = {e.name for e in entry_points(group="console_scripts")}
    deployed = {
        c["image"].split("/")[-1].split(":")[0]: c["args"]
        for d in by_kind(render(PROD), "Deployment").values()
        for c in pod(d)["containers"]
        if not d["metadata"]["name"].startswith("mlplane-dagster-")
    }
    for target in TARGETS:
        assert "USER mlplane" in found[target], target
        command = command_of(found[target])
        assert command[0] in scripts
        assert CliRunner().invoke(click_command(command[0]), [*command[1:], "--help"]).exit_code == 0, command
        assert deployed[target] == command, target


def test_the_units_cannot_write_into_their_source_tree():
    """The code is installed as root and runs as mlplane: a write into the checkout fails instead of
    landing in a container's layer. Only the Dagster home is the user's."""
    text = DOCKERFILE.read_text()
    assert re.findall(r"chown\s+-R\s+mlplane:mlplane\s+(\S+)", text) == ["/opt/dagster"]
    assert "PYTHONDONTWRITEBYTECODE=1" in text  # no __pycache__ written beside the code at run time
