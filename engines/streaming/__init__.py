"""Streaming features: Flink jobs compiled from the DSL, their health, and the bridge that pushes
their results into the online store. Plain Python, no Dagster.

- `job`: the job on a local PyFlink mini-cluster (a process of .venv-flink) and its health;
- `cluster`: the same job on a Flink session cluster, submitted and watched through the
  JobManager's REST API, and a standalone cluster started from the wheel's own `bin/`;
- `sink`: the directory Flink's filesystem sink commits to at checkpoints (exactly once), and the
  job's own counts;
- `pusher`: applies committed results to the online store with Feast's push path, newest window
  per entity wins, so a file applied twice or a window re-emitted after a restart never
  double-counts;
- `backfill`: the same SQL in batch mode over landing days, and its check against the polars plan.
"""

from engines.streaming.backfill import (
    HISTORY_ZONE,
    backfill,
    days_before,
    differences_from_offline,
    rows_by_day,
    stage_landing,
    window_rows,
)
from engines.streaming.cluster import ClusterJob, ClusterSettings, FlinkRest, StandaloneCluster, make_job
from engines.streaming.job import (
    DEFAULT_FLINK_PYTHON,
    PROJECT_ROOT,
    FlinkJob,
    JobHealth,
    StreamingJobError,
    StreamingJobSettings,
    process_alive,
    streaming_sources,
    terminate_group,
)
from engines.streaming.pusher import OnlinePusher, PusherConfig, run_pusher
from engines.streaming.sink import (
    TOTALS_FILE,
    committed_files,
    fold_metrics,
    job_metrics,
    read_committed_rows,
)
from feature_defs.compile.flink import WINDOW_END, SourceOptions

__all__ = [
    "DEFAULT_FLINK_PYTHON",
    "HISTORY_ZONE",
    "PROJECT_ROOT",
    "TOTALS_FILE",
    "WINDOW_END",
    "ClusterJob",
    "ClusterSettings",
    "FlinkJob",
    "FlinkRest",
    "JobHealth",
    "OnlinePusher",
    "PusherConfig",
    "SourceOptions",
    "StandaloneCluster",
    "StreamingJobError",
    "StreamingJobSettings",
    "backfill",
    "committed_files",
    "days_before",
    "differences_from_offline",
    "fold_metrics",
    "job_metrics",
    "make_job",
    "process_alive",
    "read_committed_rows",
    "rows_by_day",
    "run_pusher",
    "stage_landing",
    "streaming_sources",
    "terminate_group",
    "window_rows",
]
