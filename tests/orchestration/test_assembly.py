"""Assembly without hand-kept lists: whatever a module of assets/ (or jobs/, or the orchestration
modules) defines is in the Definitions."""

from __future__ import annotations

import importlib
import pkgutil

from dagster import AssetChecksDefinition, AssetsDefinition

import assets
import jobs
from assets.notebooks import NotebookPipeline
from assets.pipelines import TrainingPipeline
from orchestration.dagster_internals import UnresolvedAssetJobDefinition
from orchestration.definitions import defs


def module_values():
    for info in pkgutil.walk_packages(assets.__path__, prefix="assets."):
        for value in vars(importlib.import_module(info.name)).values():
            yield from value if type(value) in (list, tuple) else [value]


def test_every_asset_check_and_pipeline_of_every_assets_module_is_defined():
    graph = defs.resolve_asset_graph()
    repository = defs.get_repository_def()
    keys, checks, pipelines = set(), set(), []
    for value in module_values():
        if isinstance(value, AssetChecksDefinition):
            checks |= set(value.check_keys)
        elif isinstance(value, AssetsDefinition):
            keys |= set(value.keys)
        elif isinstance(value, TrainingPipeline | NotebookPipeline):
            pipelines.append(value)
    assert keys and checks and len(pipelines) >= 2
    assert keys <= set(graph.get_all_asset_keys())
    assert checks <= set(graph.asset_check_keys)
    for pipeline in pipelines:
        assert repository.has_job(pipeline.job.name)
        assert repository.has_schedule_def(pipeline.schedule.name)


def test_every_job_of_jobs_is_defined():
    names = {v.name for v in vars(jobs).values() if isinstance(v, UnresolvedAssetJobDefinition)}
    assert {"daily_pipeline", "batch_inference", "streaming_backfill"} <= names
    assert names <= {job.name for job in defs.get_repository_def().get_all_jobs()}
