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


def fit_trainer(trainer, num_workers: int):
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


@contextmanager
def staging_folder(storage: Path) -> Iterator[Path]:
    """A fresh folder under the run's storage (which every worker reaches) where the training function writes
    its checkpoint (created by it); removed, with whatever it holds, when the block ends."""
    folder = Path(storage) / "staging" / uuid.uuid4().hex
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
