"""What the trainings share around Ray Train's `TorchTrainer`: a run with workers, or in this process.

`num_workers=0` is Ray Train's local mode: the training function runs in the calling process, with the
same `ray.train` calls, and no controller, workers or helper actors start (on the 2-core machine those
cost each training about 9 s and 13 CPU-seconds before it trained). Two things differ, and these
helpers hide them:
- a local run's context is a process global of Ray Train: local runs of one process take turns;
- a local run's checkpoint is the folder the function reported, not a copy in the run's storage: the
  functions write theirs in a staging folder that lives until the caller has read the result.

Runs with workers survive the loss of a worker or its node: Ray Train restarts the worker group up to
`max_failures` times, and the training functions checkpoint every epoch (`EpochCheckpoints`) and resume
from the latest one, so a lost node costs at most the epoch it was running.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_LOCAL_RUNS = threading.Lock()
MAX_FAILURES = 3  # worker-group restarts a run survives (a lost node, a killed worker)
RANK_FILE = "rank{rank}.pt"  # each worker's own resume state in a checkpoint (its sampling streams)


@contextmanager
def fitted(
    loop,
    loop_config: dict,
    scaling,
    storage: Path,
    name: str,
    datasets: dict | None = None,
    max_failures: int = MAX_FAILURES,
) -> Iterator:
    """A `TorchTrainer` run of `loop` on `scaling` (a ScalingConfig; no workers: in this process), its
    checkpoints under `storage`, which every worker must reach; its Result while the block runs, the
    checkpoint readable until the block ends. The loop writes its checkpoints with `EpochCheckpoints`.
    A failed worker group is restarted up to `max_failures` times, from the latest checkpoint."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    staging = Path(storage) / "staging" / uuid.uuid4().hex
    try:
        trainer = TorchTrainer(
            loop,
            # a run in this process has no worker to lose: its checkpoint is the last epoch's alone
            train_loop_config={**loop_config, "staging": str(staging), "every_epoch": bool(scaling.num_workers)},
            scaling_config=scaling,
            run_config=RunConfig(
                name=name,
                storage_path=str(storage),
                failure_config=FailureConfig(max_failures=max_failures),
                checkpoint_config=CheckpointConfig(num_to_keep=2),  # the latest, and one while it uploads
            ),
            datasets=datasets,
        )
        yield _fit(trainer, scaling.num_workers)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class EpochCheckpoints:
    """A training function's checkpoint at the end of every epoch, and the state to resume from after a
    restart. Every worker reports one: rank 0 the files all ranks share (the model, the optimizer), each
    rank its own `rank<r>.pt` (its random streams), merged by Ray Train into one checkpoint; a worker
    group restarted on other nodes reads the latest one back from the run's storage."""

    def __init__(self, loop_config: dict, rank: int):
        self.staging = Path(loop_config["staging"]) / f"rank{rank}"
        self.every_epoch = loop_config.get("every_epoch", True)
        self.rank = rank
        self.previous: Path | None = None

    def resumed(self) -> dict | None:
        """The latest checkpoint's files by name, this rank's own as `rank`; None on a fresh start."""
        import ray.train
        import torch

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            files = {p.name: p for p in Path(folder).iterdir() if p.suffix == ".pt"}
            state = {name: torch.load(path, map_location="cpu", weights_only=False) for name, path in files.items()}
        state["rank"] = state.get(RANK_FILE.format(rank=self.rank))
        return state

    def report(self, epoch: int, metrics: dict, files: dict[str, object], last: bool) -> Path | None:
        """Report `metrics` with a checkpoint of `files` (name -> object, saved with torch.save; none: the
        metrics alone) after epoch `epoch` (`last`: the run's final one). Returns the folder reported (the
        checkpoint itself in local mode)."""
        import ray.train
        import torch

        if not files or not (self.every_epoch or last):
            ray.train.report(metrics)
            return None

        folder = self.staging / f"epoch{epoch}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in files.items():
            torch.save(value, folder / name)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(folder)))
        # reported: copied to storage (with workers) or superseded (local mode), so the older one can go
        if self.previous is not None:
            shutil.rmtree(self.previous, ignore_errors=True)
        self.previous = folder
        return folder


def node_id() -> str:
    """The Ray node this training function runs on ("local" in a process without Ray): the trainings
    record it per epoch, which shows where each epoch ran across restarts."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"


def _fit(trainer, num_workers: int):
    """`trainer.fit()`; a local run takes its turn, and this process gets back its torch threads, which the
    training function sets to the worker's CPUs."""
    if num_workers:
        return trainer.fit()
    import torch

    with _LOCAL_RUNS:
        threads = torch.get_num_threads()
        try:
            return trainer.fit()
        finally:
            torch.set_num_threads(threads)
