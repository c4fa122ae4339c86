import os
import tempfile
from contextlib import contextmanager

from dagster import ConfigurableResource
from pydantic import Field


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

    def ensure_started(self) -> None:
        """Start (or join) Ray unless this process already did."""
        import ray

        if ray.is_initialized():
            return
        if self.address:
            ray.init(address=self.address, log_to_driver=True)
        else:
            ray.init(
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                object_store_memory=self.object_store_mb * 1024 * 1024,
                _temp_dir=self.temp_dir or os.path.join(tempfile.gettempdir(), "mlplane-ray"),
                include_dashboard=False,
                log_to_driver=True,
            )

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
