import os
import tempfile
from contextlib import contextmanager

from dagster import ConfigurableResource
from pydantic import Field

# Ray Train on the in-process Ray, which has one node and no preemptible ones to watch: the controller
# polls its workers every 0.2 s (2 s by default: a short training waited that long to be seen finished)
# and starts no preemption watcher (one more process). 4 to 5 s less per training here.
LOCAL_TRAIN_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


class RayResource(ConfigurableResource):
    """Ray for batch and GPU compute. By default a Ray started in this process with capped CPUs,
    object store and a private temp folder; with `address` (`ray://...`, `auto`, a head node), an
    existing cluster. Engine code is the same either way: it uses Ray once `ensure_started()` ran."""

    address: str | None = Field(default=None, description="Existing cluster to join; None starts Ray in-process")
    num_cpus: int = Field(default=2, description="CPUs of the in-process Ray")
    num_gpus: int | None = Field(default=None, description="GPUs of the in-process Ray (None: detect)")
    object_store_mb: int = Field(default=400, description="Object store of the in-process Ray, MiB")
    temp_dir: str | None = Field(
        default=None, description="Session folder of the in-process Ray (default: <tmp>/mlplane-ray)"
    )
    train_cpus_per_worker: int | None = Field(
        default=None,
        description="CPUs each Ray Train worker reserves and runs as torch threads (None: an even share "
        "of the in-process Ray's CPUs; 1 on a cluster, which other jobs share)",
    )
    log_to_driver: bool = Field(default=True, description="Print the workers' output in this process")

    def ensure_started(self) -> None:
        """Start (or join) Ray unless this process already did."""
        import ray

        if ray.is_initialized():
            return
        if self.address:
            ray.init(address=self.address, log_to_driver=self.log_to_driver)
        else:
            ray.init(
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                object_store_memory=self.object_store_mb * 1024 * 1024,
                _temp_dir=self.temp_dir or os.path.join(tempfile.gettempdir(), "mlplane-ray"),
                include_dashboard=False,
                log_to_driver=self.log_to_driver,
                runtime_env={"env_vars": LOCAL_TRAIN_ENV},
            )

    def cpus_per_worker(self, workers: int) -> int:
        """CPUs for each of `workers` training workers: a worker's torch threads use what it reserves,
        so one worker on an idle in-process Ray uses every core instead of one."""
        import ray

        if self.train_cpus_per_worker:
            return self.train_cpus_per_worker
        if self.address:
            return 1
        self.ensure_started()
        return max(1, int(ray.cluster_resources().get("CPU", 1)) // max(1, workers))

    def cluster_gpus(self) -> int:
        import ray

        self.ensure_started()
        return int(ray.cluster_resources().get("GPU", 0))

    @contextmanager
    def session(self):
        """Ray for the duration of a block; shut down after it if this block started it."""
        import ray

        started_here = not ray.is_initialized()
        self.ensure_started()
        try:
            yield self
        finally:
            if started_here:
                ray.shutdown()
