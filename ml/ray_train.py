"""What the trainings share around Ray Train's `TorchTrainer`: a run with workers, or in this process.

`num_workers=0` is Ray Train's local mode: the training function runs in the calling process, with the
same `ray.train` calls, and no controller, workers or helper actors start (on the 2-core machine those
cost each training about 9 s and 13 CPU-seconds before it trained). Two things differ, and these
helpers hide them:
- a local run's context is a process global of Ray Train: local runs of one process take turns;
- a local run's checkpoint is the folder the function reported, not a copy in the run's storage: the
  functions write theirs in a staging folder that lives until the caller has read the result.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_LOCAL_RUNS = threading.Lock()


@contextmanager
def fitted(loop, loop_config: dict, scaling, storage: Path, name: str, datasets: dict | None = None) -> Iterator:
    """A `TorchTrainer` run of `loop` on `scaling` (a ScalingConfig; no workers: in this process), its
    checkpoints under `storage`, which every worker must reach; its Result while the block runs, the
    checkpoint readable until the block ends. The loop writes its checkpoint in `checkpoint_folder`."""
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    staging = Path(storage) / "staging" / uuid.uuid4().hex
    try:
        trainer = TorchTrainer(
            loop,
            train_loop_config={**loop_config, "staging": str(staging)},
            scaling_config=scaling,
            run_config=RunConfig(name=name, storage_path=str(storage)),
            datasets=datasets,
        )
        yield _fit(trainer, scaling.num_workers)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def checkpoint_folder(loop_config: dict) -> Path:
    """Where the training function writes the checkpoint it reports: a folder that outlives the report."""
    folder = Path(loop_config["staging"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
