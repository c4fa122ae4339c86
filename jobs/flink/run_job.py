"""The one PyFlink job body: runs a compiled job spec (feature_defs/compile/flink.py) on the local
mini-cluster or submits it to a session cluster, so no feature has hand-written Flink code.

Runs inside .venv-flink (standard library, pyflink and dagster-pipes only):

    .venv-flink/bin/python jobs/flink/run_job.py SPEC.json --state-dir DIR [--restore CHECKPOINT]
        [--rest HOST:PORT --restart-attempts N]

Locally it writes DIR/status.json every second (process, Flink job id and status, restored
checkpoint) for the platform to watch. Under dagster-pipes (launched by FlinkResource) it reports
the job id once the job runs and closes the pipe; the job keeps running after that. Restarts are
off: a failure ends the process with the cause in status.json, so the platform sees and reports it.

With --rest it submits the job to that cluster (remote execution), writes the job id to
status.json and returns; the cluster runs it, restarting it from its newest checkpoint up to
--restart-attempts times, and the platform watches it through the JobManager's REST API.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

TERMINAL = {"FINISHED", "FAILED", "CANCELED"}
# our connectors (jobs/flink/connectors, built by scripts/setup-flink); a remote job ships them along
CONNECTORS = Path(sys.prefix) / "mlplane-connectors.jar"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--restore", default=None, help="a retained checkpoint (chk-N folder) to resume from")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    parser.add_argument("--watermark-interval-ms", type=int, default=200, help="how often the watermark moves on")
    parser.add_argument(
        "--rest",
        default=None,
        help="HOST:PORT of a session cluster's JobManager: submit there "
        "(execution.target remote), report the job id and return; the cluster runs it",
    )
    parser.add_argument(
        "--restart-attempts",
        type=int,
        default=0,
        help="restarts from the newest checkpoint before the job fails (cluster: a lost TaskManager)",
    )
    parser.add_argument(
        "--state-changelog",
        action="store_true",
        help="streaming: log state changes to DIR/changelog, so a checkpoint uploads only what changed",
    )
    parser.add_argument(
        "--state-backend",
        choices=["hashmap", "rocksdb"],
        default="hashmap",
        help="streaming: where operator state lives, the JVM heap or RocksDB on local disk (state beyond memory)",
    )
    parser.add_argument("--parallelism", type=int, default=1, help="local mini-cluster: slots and parallelism")
    parser.add_argument("--managed-memory", default=None, help="local mini-cluster: managed memory, e.g. 1g")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    status = StatusFile(args.state_dir / "status.json", spec["name"], spec["mode"], args.restore)
    with pipes_or_nothing() as pipes:
        try:
            client = submit(spec, args)
        except Exception as error:  # bad SQL, missing JAR, ...: say so where the platform looks
            status.write("FAILED", error=f"{type(error).__name__}: {error}")
            raise
        job_id = str(client.get_job_id())
        if args.rest:  # the cluster runs it now; its REST API says how it goes
            status.write("SUBMITTED", job_id=job_id, rest=args.rest)
            if pipes:
                pipes.report_custom_message({"job_id": job_id, "status": "SUBMITTED"})
            return 0
        state = wait_for(client, status, job_id, until={"RUNNING"} | TERMINAL)
        if pipes:
            pipes.report_custom_message({"job_id": job_id, "status": state})
    if state not in TERMINAL:
        state = wait_for(client, status, job_id, until=TERMINAL)
    if state != "FINISHED":
        status.write(state, job_id=job_id, error=failure_cause(client) or f"the job ended {state}")
        return 1
    return 0


def submit(spec: dict, args: argparse.Namespace):
    from pyflink.table import EnvironmentSettings, TableEnvironment

    settings = (
        EnvironmentSettings.in_streaming_mode() if spec["mode"] == "streaming" else EnvironmentSettings.in_batch_mode()
    )
    env = TableEnvironment.create(settings)
    config = env.get_config()
    checkpoints = (args.state_dir / "checkpoints").resolve()
    values = {
        "pipeline.name": spec["name"],
        "parallelism.default": str(args.parallelism),
        "python.executable": sys.executable,
        "restart-strategy.type": "none",
        "table.exec.resource.default-parallelism": str(args.parallelism),
        "pipeline.jars": CONNECTORS.resolve().as_uri(),
    }
    if args.managed_memory:
        values["taskmanager.memory.managed.size"] = args.managed_memory
    if args.restart_attempts:
        values |= {
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": str(args.restart_attempts),
            "restart-strategy.fixed-delay.delay": "1s",
        }
    if args.rest:
        host, port = args.rest.rsplit(":", 1)
        values |= {"execution.target": "remote", "rest.address": host, "rest.port": port}
    if spec["mode"] == "streaming":
        values |= {
            "execution.checkpointing.interval": f"{args.checkpoint_interval_ms}ms",
            "pipeline.auto-watermark-interval": f"{args.watermark_interval_ms}ms",
            "execution.checkpointing.dir": checkpoints.as_uri(),
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            "execution.checkpointing.num-retained": "2",
        }
        values["state.backend.type"] = args.state_backend
        if args.state_changelog:
            values |= {
                "state.changelog.enabled": "true",
                "state.changelog.storage": "filesystem",
                "state.changelog.dstl.dfs.base-path": (args.state_dir / "changelog").resolve().as_uri(),
            }
        if args.restore:
            values["execution.state-recovery.path"] = Path(args.restore).resolve().as_uri()
            if args.state_changelog:  # the default (NO_CLAIM) needs a full first checkpoint, which it cannot take
                values["execution.state-recovery.claim-mode"] = "CLAIM"
    for key, value in values.items():
        config.set(key, value)
    for statement in spec["statements"]:
        env.execute_sql(statement)
    statements = env.create_statement_set()
    for insert in spec["inserts"]:
        statements.add_insert_sql(insert)
    return statements.execute().get_job_client()


def wait_for(client, status: StatusFile, job_id: str, until: set[str]) -> str:
    while True:
        try:
            state = str(client.get_job_status().result()).rsplit(".", 1)[-1]
        except Exception:  # the mini-cluster forgets a job once it ends: ask for its result instead
            state = "FINISHED" if failure_cause(client) is None else "FAILED"
        status.write(state, job_id=job_id)
        if state in until:
            return state
        time.sleep(1.0)


def failure_cause(client) -> str | None:
    """None when the job finished; otherwise the root cause the Java exception carries."""
    try:
        client.get_job_execution_result().result()
    except Exception as error:
        return "".join(traceback.format_exception_only(error)).strip()[-4000:]
    return None


class StatusFile:
    def __init__(self, path: Path, name: str, mode: str, restored_from: str | None):
        self.path = path
        self.base = {
            "name": name,
            "mode": mode,
            "pid": os.getpid(),
            "started_at": time.time(),
            "restored_from": restored_from,
        }
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, state: str, **extra) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({**self.base, "status": state, "updated_at": time.time(), **extra}))
        os.replace(tmp, self.path)


@contextlib.contextmanager
def pipes_or_nothing():
    if "DAGSTER_PIPES_CONTEXT" not in os.environ:
        yield None
        return
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        yield pipes


if __name__ == "__main__":
    sys.exit(main())
