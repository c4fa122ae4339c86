"""Every command block of the README and of docs/ works as written, without an activated environment, on the
demo's lake: the quick commands run in full, the long ones at a small scale (the substitutions
below), servers are started, answered and stopped. A README or docs change that breaks a command fails CI.
The pages run in the order of PAGES: later commands read what earlier ones made (the demo's lake, a server).

Commands run with bash in a copy of the checkout (links to it, with its own data/ and
.dagster_home/), PATH without the environment's bin folder. The streaming views run at an hourly slide
(MLPLANE_STREAMING_SLIDE_SECONDS, the live job's setting) instead of every minute: the Flink backfills of
the demo and of the README's commands then record 60 times fewer windows, as a small scale does."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from orchestration.profiles import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
DOCS = PROJECT_ROOT / "docs"
# The order the commands run in: the README, then each system's page (every page of docs/ is listed).
PAGES = [
    README,
    DOCS / "features.md",
    DOCS / "ground-truth.md",
    DOCS / "content-safety.md",
    DOCS / "streaming.md",
    DOCS / "models.md",
    DOCS / "experiments.md",
    DOCS / "gateway.md",
    DOCS / "model-server.md",
    DOCS / "benchmarks.md",
    DOCS / "operations.md",
    DOCS / "architecture.md",
    DOCS / "landing-format.md",
]
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Way:
    """How the test runs a command: as written, with `small` substitutions, or (`covered_by`) not
    here because it needs a trained model, vLLM or another service that the named test starts."""

    small: dict[str, str] = field(default_factory=dict)
    covered_by: str | None = None
    timeout: int = 900
    serves: int | None = None  # a server on this port: started, waited for, and stopped at the end
    prints: str | None = None  # a pattern its output must hold (what the README says the command shows)
    refused: str | None = None  # a documented refusal: a failed exit whose output holds this pattern passes


# Keyed by the start of a command; commands not listed run as written.
CLI_BACKFILL = "tests/orchestration/test_definitions.py::test_three_day_backfill_with_the_dagster_cli"
SMALL_VECTORS = "--vectors 2000 --local-mode-vectors 500"  # the default 100,000-point index takes 40 s
BENCHMARK = ".venv/bin/python benchmarks/"
SMALL_EPOCHS = """ --config-json '{"ops": {"clip_model": {"config": {"epochs": 1}}}}'"""
WAYS = {
    "scripts/demo": Way(
        small={"scripts/demo": "scripts/demo --scale 0.2"},
        prints=r"mlplane search \"[^\"]+\": item \d+(?s:.*)\d+ answers by 4 simulated annotators(?s:.*)"
        r"POST /recommend \{\"user_id\": \d+, \"k\": 5\} -> items \[\d+(, \d+){4}\] .*model "
        r"version 1(?s:.*)monitoring/online_accuracy \d{4}-\d\d-\d\d(?s:.*)treatment",
    ),
    "scripts/test": Way(
        small={
            "scripts/test": "scripts/test -q -p no:cacheprovider -m 'not services' "
            "tests/orchestration/test_graph_snapshot.py"
        }
    ),
    ".venv/bin/mlplane simulate": Way(small={"--days 7": "--days 2 --scale 0.1 --data-dir sim-only"}),
    ".venv/bin/mlplane ui": Way(covered_by="tests/cli/test_cli.py::test_ui_starts_without_an_activated_environment"),
    # the two range backfills: the same commands over fixed days on a lake of their own (CLI test, 100 s)
    "DAGSTER_HOME=$PWD/.dagster_home .venv/bin/dagster asset materialize -m orchestration.definitions "
    '--select "group:ingestion': Way(covered_by=CLI_BACKFILL),
    "DAGSTER_HOME=$PWD/.dagster_home .venv/bin/dagster asset materialize -m orchestration.definitions "
    '--select "group:streaming_history': Way(covered_by=CLI_BACKFILL),
    "DAGSTER_HOME=$PWD/.dagster_home .venv/bin/dagster asset materialize -m orchestration.definitions "
    "--select clip_model": Way(small={"--select clip_model": "--select clip_model" + SMALL_EPOCHS}),
    # one day's items, as the search after reads the champion's vectors of whatever was embedded
    "DAGSTER_HOME=$PWD/.dagster_home .venv/bin/dagster asset materialize -m orchestration.definitions "
    '--select "embeddings/items,content_violations/flags,vectors/items"': Way(small={"'3 days ago'": "yesterday"}),
    # the gate may refuse the third version (docs/models.md): the run then fails on that check, as documented
    "DAGSTER_HOME=$PWD/.dagster_home .venv/bin/dagster asset materialize -m orchestration.definitions "
    '--select "models/personalization,models/personalization_champion"': Way(
        refused=r"blocking asset check failed with ERROR severity:\s+models/personalization: beats_(champion|baseline)"
    ),
    ".venv/bin/mlplane models rollback": Way(
        covered_by="tests/models/test_personalization.py::test_gate_blocks_a_"
        "worse_challenger_then_rollback_and_corruption"
    ),
    ".venv-vllm/bin/vllm serve": Way(covered_by="tests/serving/gateway/test_gateway.py (vllm_backends)"),
    "MLPLANE_GATEWAY_ADMIN_KEY=... .venv/bin/mlplane gateway serve": Way(
        covered_by="tests/serving/gateway/test_gateway.py"
    ),
    ".venv/bin/python benchmarks/online_features.py": Way(
        small={"online_features.py": "online_features.py --data-dir data --repeat 2"}
    ),
    ".venv/bin/python benchmarks/embeddings.py": Way(
        small={"embeddings.py": "embeddings.py --images 16 --vit-images 0 --repeat 1 " + SMALL_VECTORS}
    ),
    ".venv/bin/python benchmarks/geometry.py": Way(small={"--items 2000 --repeat 5": "--items 40 --repeat 1"}),
    ".venv/bin/python benchmarks/pusher_poll.py": Way(
        small={"pusher_poll.py": "pusher_poll.py --files 50 --repeats 2"}
    ),
    ".venv/bin/python benchmarks/online_write.py": Way(
        small={"online_write.py": "online_write.py --rows 10 --repeats 2"}
    ),
    ".venv/bin/python benchmarks/materialize.py": Way(
        small={"--pairs 40000 --days 2 --repeats 5": "--pairs 200 --days 2 --repeats 1"}, prints=r"feast / ours"
    ),
    ".venv/bin/python benchmarks/ray_train_local.py": Way(
        small={"--steps 200 --repeats 5": "--steps 5 --repeats 1"}, prints=r"worker / local"
    ),
    ".venv/bin/python benchmarks/streaming_freshness.py": Way(
        small={"streaming_freshness.py": "streaming_freshness.py --help"}
    ),
    ".venv/bin/python benchmarks/gateway.py": Way(small={"gateway.py": "gateway.py --help"}),
    ".venv/bin/python benchmarks/batch_inference.py": Way(small={"--users 100000 --repeat 5": "--help"}),
    ".venv/bin/python benchmarks/labeling.py": Way(small={"--annotators 20 --items 500": "--annotators 4 --items 20"}),
    ".venv/bin/python benchmarks/model_quality.py": Way(small={"model_quality.py": "model_quality.py --help"}),
    ".venv/bin/python benchmarks/experiments.py": Way(
        small={"experiments.py": "experiments.py --runs 100 --lift 0.1 --layer-runs 2"},
        prints=r"group sequential \(platform\)",
    ),
    ".venv/bin/python benchmarks/search_quality.py": Way(small={"search_quality.py": "search_quality.py --help"}),
    ".venv/bin/mlplane labeling add-account": Way(small={"--role": "--password readme-pass --role"}),
    ".venv/bin/mlplane labeling serve": Way(serves=8700),
    ".venv/bin/mlplane serve models": Way(serves=8500),
    # after the demo every model the server lists is ready (CLIP registered by the demo)
    "curl -s localhost:8500/v2/repository/index": Way(prints=r'\A(?![\s\S]*"UNAVAILABLE")[\s\S]*"READY"'),
    # the admin key exported just before reaches the server and the call: a missing key would be a 401
    "curl -s -X POST localhost:8500/v2/repository/models/personalization/load": Way(prints=r'"state":\s*"READY"'),
    ".venv/bin/python benchmarks/online_serving.py": Way(small={"online_serving.py": "online_serving.py --help"}),
    ".venv/bin/mlplane gateway rollout": Way(covered_by="tests/serving/llm/test_llm_rollout.py"),
    ".venv/bin/python benchmarks/clip_training.py": Way(small={"--repeats 30": "--repeats 1"}),
    ".venv/bin/python benchmarks/speculative.py": Way(
        small={"speculative.py --requests 16 --max-tokens 64 --repeats 3": "speculative.py --help"}
    ),
    "DAGSTER_HOME=$PWD/.dagster_home .venv/bin/dagster asset materialize -m orchestration.definitions "
    "--select llm/item_descriptions": Way(covered_by="tests/serving/llm/test_llm_batch_asset.py"),
}


def pages_text() -> str:
    return "\n".join(page.read_text() for page in PAGES)


def readme_commands(text: str | None = None) -> list[str]:
    """The commands of the bash blocks of the pages (or of `text`), continuation lines joined, comments
    dropped."""
    commands = []
    for language, body in FENCE.findall(text if text is not None else pages_text()):
        if language != "bash":
            continue
        for command in re.sub(r"\\\n\s*", "", body).splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def way_of(command: str) -> Way:
    matches = [prefix for prefix in WAYS if command.startswith(prefix)]
    return WAYS[max(matches, key=len)] if matches else Way()


def as_run(command: str) -> str:
    way = way_of(command)
    for old, new in way.small.items():
        assert old in command, f"README command changed, update WAYS in {__file__}: {command}"
        command = command.replace(old, new, 1)
    return command


def test_every_readme_command_names_what_exists():
    commands = readme_commands()
    assert len(commands) > 20
    for command in commands:
        for program in re.findall(r"(?:^|\s)(\.venv[\w-]*/bin/[\w-]+|scripts/[\w-]+|benchmarks/[\w.]+)", command):
            assert (PROJECT_ROOT / program).exists() or program.startswith(".venv"), (program, command)
        way = way_of(command)
        assert way.covered_by is None or (PROJECT_ROOT / way.covered_by.split("::")[0].split(" ")[0]).exists()
        as_run(command)  # its substitutions still apply


def test_every_docs_page_is_listed_and_linked_from_the_readme():
    assert sorted(DOCS.glob("*.md")) == sorted(PAGES[1:])
    linked = {(PROJECT_ROOT / target).resolve() for target in LINK.findall(README.read_text())}
    assert not [page.name for page in PAGES[1:] if page.resolve() not in linked]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            path, _, anchor = target.partition("#")
            if re.match(r"[a-z]+:", path):
                continue
            linked = (page.parent / path) if path else page
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
                broken.append(f"{page.relative_to(PROJECT_ROOT)}: {target}")
    assert not broken


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The project, linked entry by entry, with its own lake and Dagster instance."""
    root = tmp_path_factory.mktemp("checkout")
    for entry in PROJECT_ROOT.iterdir():
        if entry.name not in {"data", ".dagster_home", ".git", "sim-only"}:
            (root / entry.name).symlink_to(entry)
    return root


def environment(checkout: Path, exported: dict[str, str] | None = None) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    path = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if p != bin_dir)
    return {
        **os.environ,
        "PATH": path,
        "MLPLANE_DATA_DIR": str(checkout / "data"),
        "DAGSTER_HOME": str(checkout / ".dagster_home"),
        "VIRTUAL_ENV": "",
        "MLPLANE_STREAMING_SLIDE_SECONDS": "3600",
        **(exported or {}),
    }


def run(command: str, checkout: Path, exported: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=checkout,
        env=environment(checkout, exported),
        capture_output=True,
        text=True,
        timeout=way_of(command).timeout,
    )


def serve(command: str, checkout: Path, port: int, log: Path, exported: dict[str, str]) -> subprocess.Popen:
    """Starts a README server command in its own process group and waits until it answers on `port`."""
    server = subprocess.Popen(
        ["bash", "-c", command],
        cwd=checkout,
        env=environment(checkout, exported),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.2)
    stop(server)
    raise AssertionError(f"$ {command} did not answer on port {port}:\n{log.read_text()[-2500:]}")


def stop(server: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def export(command: str, checkout: Path, exported: dict[str, str]) -> bool:
    """`export NAME=value` as a reader's shell keeps it: later commands see NAME."""
    match = re.fullmatch(r"export (\w+)=(.+)", command)
    if match:
        out = run(f"printf %s {match[2]}", checkout, exported)
        assert out.returncode == 0, (command, out.stderr)
        exported[match[1]] = out.stdout
    return bool(match)


def check_demo(out: str, checkout: Path) -> None:
    """What the demo says it produced is in the lake and in the Dagster instance the UI reads."""
    produced = {
        t: (int(p), int(r.replace(",", "")))
        for t, p, r in re.findall(r"^\s+(\w+/\w+)\s+(\d+) partitions\s+([\d,]+) rows$", out, re.M)
    }
    # four days, and the outcomes of the A/B test on the day after
    assert produced["warehouse/interactions"][0] == 5 and produced["streaming_history/item_trending"][0] == 4
    # the last day's training set waits for the next day's interactions (its labels look past midnight)
    partitions, rows = produced["datasets/personalization_training"]
    assert partitions == 3 and rows > 100
    report = Path(re.search(r"Data-quality report: (\S+)", out).group(1))
    assert report.exists() and "mlplane" in report.read_text()
    assert "mlplane ui" in out
    instance = DagsterInstance.from_config(str(checkout / ".dagster_home"))
    try:
        runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.SUCCESS]))
        assert {r.job_name for r in runs} >= {
            "daily_pipeline",
            "streaming_backfill",
            "training_data",
            "feature_store_refresh",
            "item_embeddings_daily",
            "ground_truth_queues",
            "__ASSET_JOB",  # clip_model and the release, as `dagster asset materialize` runs them
        }
    finally:
        instance.dispose()


@pytest.mark.services  # the demo, then every README command on its lake
def test_readme_commands_work_as_written_on_the_demos_lake(checkout):
    # the gateway's commands read the gateway page's own gateway.yaml
    (checkout / "gateway.yaml").write_text(
        next(body for lang, body in FENCE.findall(pages_text()) if lang == "yaml" and "model_list" in body)
    )
    failures, ran, covered, servers, seconds, exported = [], 0, [], {}, {}, {}
    try:
        for command in readme_commands():
            started = time.monotonic()
            way = way_of(command)
            if way.covered_by:
                covered.append(way.covered_by)
                continue
            if command.startswith(BENCHMARK) and as_run(command) in seconds:
                continue  # a page repeats a benchmark another page ran: the same run again measures nothing new
            ran += 1
            if export(command, checkout, exported):
                continue
            if way.serves:
                if way.serves in servers:  # a later page starts it again, with other settings
                    stop(servers.pop(way.serves))
                log = checkout / f"server-{way.serves}.log"
                servers[way.serves] = serve(as_run(command), checkout, way.serves, log, exported)
                continue
            out = run(as_run(command), checkout, exported)
            seconds[as_run(command)] = time.monotonic() - started
            if out.returncode != 0 and not (way.refused and re.search(way.refused, out.stdout + out.stderr)):
                failures.append(f"$ {as_run(command)}\n{out.stdout[-1500:]}\n{out.stderr[-2500:]}")
            elif way.prints and not re.search(way.prints, out.stdout):
                failures.append(f"$ {as_run(command)} did not print {way.prints!r}:\n{out.stdout[-2500:]}")
            if command.startswith("scripts/demo"):
                if out.returncode != 0:
                    break  # every later command reads the demo's lake
                check_demo(out.stdout, checkout)
    finally:
        for server in servers.values():
            stop(server)
        print("README commands, slowest first:")  # shown with -s, and on a failure
        for command, took in sorted(seconds.items(), key=lambda kv: -kv[1]):
            print(f"{took:7.1f} s  {command[:150]}")
    assert not failures, "\n\n".join(failures)
    # every `covered_by` way matched one README command: none is stale
    assert ran >= 20 and sorted(covered) == sorted(w.covered_by for w in WAYS.values() if w.covered_by)
