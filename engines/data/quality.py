"""Data-quality engine: validates data frames against code-declared great-expectations suites.

Every validation result is stored in a file-based GX project, so ``build_docs`` can render
Data Docs with one validation page per run. Plain Python on purpose: the Dagster asset checks
and the Data Docs asset wrap it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import great_expectations as gx
import pandas as pd
from great_expectations.data_context.types.base import ProgressBarsConfig
from great_expectations.exceptions.resource_freshness import ResourceFreshnessAggregateError

from engines.data.data_docs import make_offline
from engines.data.expectations import Suite

# One pandas data source holds one dataframe asset per suite; the frame is passed per run.
_DATASOURCE = "mlplane"
_BATCH_DEFINITION = "whole_dataframe"


class Outcome(NamedTuple):
    expectation: str  # GX expectation type, e.g. "expect_column_values_to_not_be_null"
    column: str | None  # None for table-level expectations
    success: bool
    observed: str  # short human-readable description of what was measured


@dataclass(frozen=True)
class ValidationSummary:
    suite_name: str
    run_name: str
    success: bool
    # evaluated_expectations, successful_expectations, unsuccessful_expectations, success_percent
    statistics: dict[str, Any]
    outcomes: list[Outcome]

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success]

    def as_table_rows(self) -> list[dict[str, Any]]:
        return [o._asdict() for o in self.outcomes]


class QualityEngine:
    """Validates frames in a file-based GX project under ``root_dir`` (created on first use)."""

    def __init__(self, root_dir: Path) -> None:
        self.root_dir = Path(root_dir)
        self._gx_context: Any = None
        self._config_stamp: int | None = None
        # suite name -> (the Suite, its registered ValidationDefinition) in the open context: registering
        # again an unchanged suite was a third of each validation (0.2 s; 81 validations in the demo)
        self._definitions: dict[str, tuple[Suite, Any]] = {}

    @property
    def docs_index_path(self) -> Path:
        # GX's default "local_site" Data Docs site of a file project rooted at root_dir.
        return self.root_dir / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"

    def validate(self, suite: Suite, df: Any, run_name: str) -> ValidationSummary:
        """Validate a pandas or polars frame and store the result for Data Docs."""
        with self._locked() as context:
            return self._validate(context, suite, _to_pandas(df), run_name)

    def _validate(self, context: Any, suite: Suite, frame: pd.DataFrame, run_name: str) -> ValidationSummary:
        # The filesystem results store rejects "/" and "\\" in key parts (run names are one).
        run_id = gx.RunIdentifier(run_name=run_name.replace("/", "_").replace("\\", "_"))
        try:
            # ValidationDefinition.run stores the result in the project's validation results store;
            # rendering Data Docs is left to build_docs because it costs ~5x the validation itself.
            result = self._definition(context, suite).run(batch_parameters={"dataframe": frame}, run_id=run_id)
        except ResourceFreshnessAggregateError:  # another process changed the stored suite: ours again
            self._definitions.pop(suite.name)
            result = self._definition(context, suite).run(batch_parameters={"dataframe": frame}, run_id=run_id)
        return ValidationSummary(
            suite_name=suite.name,
            run_name=run_name,
            success=bool(result.success),
            statistics=dict(result.statistics),
            outcomes=[_outcome(r) for r in result.results],
        )

    def _definition(self, context: Any, suite: Suite) -> Any:
        """The suite's validation definition, registered in the project unless this context already did."""
        registered = self._definitions.get(suite.name)
        if registered is not None and registered[0] == suite:
            return registered[1]
        gx_suite = context.suites.add_or_update(
            gx.ExpectationSuite(name=suite.name, expectations=[e.build() for e in suite.expectations])
        )
        # Get-or-create in one call; the stored definition refers to the suite and batch
        # definition by id, so it follows suite updates.
        definition = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=suite.name, data=self._batch_definition(context, suite.name), suite=gx_suite)
        )
        self._definitions[suite.name] = (suite, definition)
        return definition

    def build_docs(self) -> Path:
        """Render Data Docs (suite pages and one page per stored validation), loading their CSS and
        JavaScript from the site itself (they open offline), and return index.html."""
        with self._locked() as context:
            context.build_data_docs()
            make_offline(self.docs_index_path.parent)  # CDN links -> the copies the platform ships
        return self.docs_index_path

    def latest_results(self) -> list[dict[str, Any]]:
        """The newest stored validation of each suite, for a summary that needs no browser."""
        rows = []
        for suite_dir in sorted((self.root_dir / "gx" / "uncommitted" / "validations").glob("*")):
            # <suite>/<run name>/<run time, sortable>/<batch>.json
            newest = max(suite_dir.glob("*/*/*.json"), key=lambda p: p.parent.name, default=None)
            if newest is None:
                continue
            result = json.loads(newest.read_text())
            stats = result["statistics"]
            rows.append(
                {
                    "suite": result["suite_name"],
                    "run": result["meta"]["run_id"]["run_name"],
                    "success": bool(result["success"]),
                    "evaluated": stats["evaluated_expectations"],
                    "failed": stats["unsuccessful_expectations"],
                }
            )
        return rows

    @contextlib.contextmanager
    def _locked(self) -> Iterator[Any]:
        """The project, held exclusively: runs in other processes share it, and GX rewrites the
        whole great_expectations.yml when it registers a suite's data asset."""
        self.root_dir.mkdir(parents=True, exist_ok=True)
        with open(self.root_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield self._context()
            finally:
                # what changed the file while we held it was our own context: no reason to reopen
                self._config_stamp = _mtime(self._config_path)
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _context(self) -> Any:
        # Reopened when another process changed the project file, so its assets are not lost (reopening
        # after each of our own changes too was 2.3 s of the demo's process, py-spy).
        stamp = _mtime(self._config_path)
        if self._gx_context is None or stamp != self._config_stamp:
            context = gx.get_context(mode="file", project_root_dir=self.root_dir)
            # In memory only, so opening a project never rewrites great_expectations.yml.
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            self._gx_context = context
            self._definitions.clear()  # bound to the old context
        return self._gx_context  # _locked records the file's stamp when it lets go

    @property
    def _config_path(self) -> Path:
        return self.root_dir / "gx" / "great_expectations.yml"

    def _batch_definition(self, context: Any, asset_name: str) -> Any:
        # Get-or-create: the data source and asset live in great_expectations.yml, so a
        # reopened project (or another process) already has them. Only the get_* methods bind
        # the asset to its context; assets from get_assets_as_dict() fail later with
        # MissingDataContextError.
        sources = context.data_sources
        try:
            datasource = sources.get(_DATASOURCE)
        except KeyError:
            datasource = sources.add_pandas(_DATASOURCE)
        try:
            asset = datasource.get_asset(asset_name)
        except LookupError:
            asset = datasource.add_dataframe_asset(asset_name)
        try:
            return asset.get_batch_definition(_BATCH_DEFINITION)
        except KeyError:
            return asset.add_batch_definition_whole_dataframe(_BATCH_DEFINITION)


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None


def null_rates(df: Any) -> dict[str, float]:
    """Fraction of missing values per column, as GX's not-null checks see them (NaN counts)."""
    frame = _to_pandas(df)
    if frame.empty:
        return {str(c): 0.0 for c in frame.columns}
    return {str(c): float(v) for c, v in frame.isna().mean().items()}


def _to_pandas(df: Any) -> pd.DataFrame:
    # GX has no polars data source; polars (and pyarrow) frames convert via to_pandas().
    return df if isinstance(df, pd.DataFrame) else df.to_pandas()


def _outcome(result: Any) -> Outcome:
    config = result.expectation_config
    return Outcome(
        expectation=config.type,
        column=config.kwargs.get("column"),
        success=bool(result.success),
        observed=_describe(result),
    )


def _describe(result: Any) -> str:
    error = _error_message(result.exception_info or {})
    if error:
        return f"error: {error}"
    measured = result.result or {}
    if "observed_value" in measured:
        return f"observed {measured['observed_value']}"
    if "unexpected_count" in measured:
        text = (
            f"{measured['unexpected_count']} of {measured['element_count']} unexpected"
            f" ({measured.get('unexpected_percent') or 0:.2f}%)"
        )
        # Samples of NaN (from the not-null checks) say nothing, so only real values are shown.
        sample = [v for v in measured.get("partial_unexpected_list", [])[:3] if not _is_missing(v)]
        return f"{text}, e.g. {sample}" if sample else text
    return "n/a"


def _error_message(info: dict[str, Any]) -> str | None:
    # exception_info is either one {"raised_exception", "exception_message", ...} dict or,
    # when metrics failed, a dict of those keyed by metric id.
    for candidate in [info, *(v for v in info.values() if isinstance(v, dict))]:
        if candidate.get("raised_exception"):
            return str(candidate.get("exception_message"))
    return None


def _is_missing(value: Any) -> bool:
    return value is None or value != value  # NaN is the only value unequal to itself
