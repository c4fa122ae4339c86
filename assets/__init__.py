"""Software-defined assets, by domain. Each module owns its assets and their checks.

Every module of this package is loaded: its assets and asset checks (module-level, or in module-level
lists) and its pipelines (`training_pipeline`, `notebook_pipeline`: assets, checks, a job, a schedule)
join the Definitions without a list to edit, so a new module cannot be forgotten."""

import importlib
import pkgutil
import sys
import warnings

from dagster import (
    AssetChecksDefinition,
    BetaWarning,
    SupersessionWarning,
    load_asset_checks_from_package_module,
    load_assets_from_package_module,
)

# backfill_policy and allow_nonexistent_upstream_partitions are beta and chosen knowingly; Dagster said
# so in every process that loads these modules, 47 times in the demo's terminal
warnings.filterwarnings("ignore", category=BetaWarning)
# Dagster 1.12 calls time-partition freshness checks superseded by FreshnessPolicy, which is in preview and
# judges an asset by its newest materialization of any partition (a backfill of an old day would hide a
# missing yesterday); the checks judge the day's own partition, so they stay
warnings.filterwarnings(
    "ignore", message="Function `build_time_partition_freshness_checks` is superseded", category=SupersessionWarning
)

from assets.notebooks import NotebookPipeline  # noqa: E402 - after the filter
from assets.pipelines import TrainingPipeline  # noqa: E402

_package = sys.modules[__name__]
_modules = [importlib.import_module(m.name) for m in pkgutil.walk_packages(__path__, prefix=f"{__name__}.")]

all_pipelines: list[TrainingPipeline | NotebookPipeline] = list(
    {
        id(value): value
        for module in _modules
        for value in vars(module).values()
        if isinstance(value, TrainingPipeline | NotebookPipeline)
    }.values()
)


def _unique(items) -> list:
    """One definition per set of keys (a module's list and a pipeline can hold the same one, and the
    loaders return copies)."""
    found: dict[frozenset, object] = {}
    for item in items:
        keys = item.check_keys if isinstance(item, AssetChecksDefinition) else item.keys
        found.setdefault(frozenset(keys), item)
    return list(found.values())


def _load() -> tuple[list, list]:
    """(assets, asset checks) of every module and pipeline; in a function, so that the loaders, which
    also read this package's own attributes, never see its partial results."""
    loaded = load_assets_from_package_module(_package)
    checks = load_asset_checks_from_package_module(_package)
    assets = [
        *(a for a in loaded if not isinstance(a, AssetChecksDefinition)),
        *(a for p in all_pipelines for a in p.assets),
    ]
    checks = [
        *checks,
        *(a for a in loaded if isinstance(a, AssetChecksDefinition)),
        *(c for p in all_pipelines for c in getattr(p, "asset_checks", [])),
    ]
    return _unique(assets), _unique(checks)


all_assets, all_asset_checks = _load()
pipeline_jobs = [p.job for p in all_pipelines]
pipeline_schedules = [p.schedule for p in all_pipelines]
