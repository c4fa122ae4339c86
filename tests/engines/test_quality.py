from pathlib import Path

import pandas as pd
import polars as pl
import pytest

from engines.data.expectations import Suite, gxe
from engines.data.quality import QualityEngine, null_rates


def _suite(*extra: gxe.Expectation) -> Suite:
    return Suite(
        name="interactions",
        expectations=[
            gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
            gxe.ExpectColumnValuesToNotBeNull(column="user_id"),
            gxe.ExpectColumnValuesToBeInSet(column="kind", value_set=["view", "buy"]),
            gxe.ExpectTableRowCountToBeBetween(min_value=1),
            *extra,
        ],
    )


def _frame(user_ids: list) -> pd.DataFrame:
    n = len(user_ids)
    return pd.DataFrame({"event_id": range(n), "user_id": user_ids, "kind": ["view", "buy"] * (n // 2)})


@pytest.fixture
def engine(tmp_path: Path) -> QualityEngine:
    return QualityEngine(root_dir=tmp_path / "gx")


def test_clean_polars_frame_passes_quietly(engine: QualityEngine, capfd: pytest.CaptureFixture[str]) -> None:
    summary = engine.validate(_suite(), pl.from_pandas(_frame([1, 2, 3, 4])), run_name="interactions 2026-01-01")

    assert capfd.readouterr() == ("", "")  # no GX progress bars
    assert summary.success
    assert summary.failures == []
    assert summary.statistics["evaluated_expectations"] == 4
    assert summary.statistics["successful_expectations"] == 4
    rows = summary.as_table_rows()
    assert {(r["expectation"], r["column"], r["success"]) for r in rows} >= {
        ("expect_column_values_to_not_be_null", "user_id", True),
        ("expect_table_row_count_to_be_between", None, True),
    }
    assert next(r for r in rows if r["column"] is None)["observed"] == "observed 4"


def test_nulls_in_not_null_column_fail_and_name_the_column(engine: QualityEngine) -> None:
    summary = engine.validate(_suite(), _frame([1, None, 3, 4]), run_name="interactions 2026-01-02")

    assert not summary.success
    assert summary.statistics["unsuccessful_expectations"] == 1
    [failure] = summary.failures
    assert (failure.expectation, failure.column) == ("expect_column_values_to_not_be_null", "user_id")
    assert failure.observed.startswith("1 of 4 unexpected")


def test_failure_shows_offending_values_and_missing_columns(engine: QualityEngine) -> None:
    suite = _suite(gxe.ExpectColumnValuesToBeBetween(column="no_such_column", min_value=0))
    frame = _frame([1, 2, 3, 4]).assign(kind=["view", "sell", "view", "buy"])

    observed = {f.column: f.observed for f in engine.validate(suite, frame, run_name="r").failures}

    assert observed["kind"] == "1 of 4 unexpected (25.00%), e.g. ['sell']"
    assert observed["no_such_column"].startswith("error: ") and "no_such_column" in observed["no_such_column"]


def test_docs_have_a_validation_page_per_run(engine: QualityEngine) -> None:
    engine.validate(_suite(), _frame([1, 2, 3, 4]), run_name="interactions 2026-01-01")
    engine.validate(_suite(), _frame([1, None, 3, 4]), run_name="interactions 2026-01-02")

    index = engine.build_docs()

    assert index == engine.docs_index_path and index.is_file()
    suite_dir = index.parent / "validations" / "interactions"
    # One page per run: validations/<suite>/<run name>/<run time>/<datasource>-<asset>.html
    pages = {p.relative_to(suite_dir).parts[0]: p.read_text() for p in suite_dir.rglob("*.html")}
    assert sorted(pages) == ["interactions 2026-01-01", "interactions 2026-01-02"]
    failed_marker = "fa-times text-danger"  # the red cross GX renders for failed results
    assert failed_marker in pages["interactions 2026-01-02"]
    assert failed_marker not in pages["interactions 2026-01-01"]
    assert "interactions 2026-01-02" in index.read_text()


def test_second_engine_on_same_folder_reuses_project_and_applies_suite_changes(tmp_path: Path) -> None:
    # One Suite object reused across calls and engines, as a module-level declaration would be.
    suite = _suite()
    QualityEngine(tmp_path).validate(suite, _frame([1, 2, 3, 4]), run_name="first")
    # A fresh engine reloads everything from disk, as a later process would.
    reopened = QualityEngine(tmp_path)
    stricter = _suite(gxe.ExpectTableRowCountToBeBetween(min_value=10))

    again = reopened.validate(suite, _frame([1, 2, 3, 4]), run_name="second")
    changed = reopened.validate(stricter, _frame([1, 2, 3, 4]), run_name="third")
    reverted = reopened.validate(suite, _frame([1, 2, 3, 4]), run_name="fourth")

    assert again.success and again.statistics["evaluated_expectations"] == 4
    assert not changed.success and changed.statistics["evaluated_expectations"] == 5
    assert [f.expectation for f in changed.failures] == ["expect_table_row_count_to_be_between"]
    assert reverted.success and reverted.statistics["evaluated_expectations"] == 4


def test_run_names_with_slashes_are_stored(engine: QualityEngine) -> None:
    assert engine.validate(_suite(), _frame([1, 2]), run_name="shop/a 2026-01-01").success
    assert (engine.root_dir / "gx" / "uncommitted" / "validations" / "interactions" / "shop_a 2026-01-01").is_dir()


def test_null_rates_count_nulls_and_nan_per_column() -> None:
    frame = pl.DataFrame({"a": [1.0, None, float("nan"), 4.0], "b": ["x", "y", None, "z"]})

    assert null_rates(frame) == {"a": 0.5, "b": 0.25}
    assert null_rates(pd.DataFrame({"a": []})) == {"a": 0.0}


def _validate_new_suites(root: str, prefix: str) -> None:
    frame = pd.DataFrame({"x": [1, 2, 3]})
    engine = QualityEngine(Path(root))
    for n in range(4):
        engine.validate(Suite(f"{prefix}_{n}", [gxe.ExpectColumnValuesToNotBeNull(column="x")]), frame, f"{prefix} {n}")


def test_an_engine_opens_the_project_once_for_its_own_changes_and_again_after_another_engines(tmp_path, monkeypatch):
    import engines.data.quality as quality

    opened = []
    get_context = quality.gx.get_context
    monkeypatch.setattr(quality.gx, "get_context", lambda **kw: opened.append(kw) or get_context(**kw))
    frame = pd.DataFrame({"x": [1, 2, 3]})
    engine = QualityEngine(tmp_path)
    for n in range(3):  # each new suite registers its data asset: our own rewrite of the project file
        engine.validate(Suite(f"own_{n}", [gxe.ExpectColumnValuesToNotBeNull(column="x")]), frame, f"run {n}")
    assert len(opened) == 1
    other = QualityEngine(tmp_path)  # as another process would: its own context, its own rewrite
    other.validate(Suite("other", [gxe.ExpectColumnValuesToNotBeNull(column="x")]), frame, "other")
    assert len(opened) == 2
    engine.validate(Suite("own_0", [gxe.ExpectColumnValuesToNotBeNull(column="x")]), frame, "after")
    assert len(opened) == 3  # reopened: the other engine's asset is kept
    assert "other" in (tmp_path / "gx" / "great_expectations.yml").read_text()


def test_an_unchanged_suite_is_registered_once_and_a_suite_another_engine_changed_again(tmp_path, monkeypatch):
    engine = QualityEngine(tmp_path)
    context = engine._context()
    registered = []
    add_or_update = type(context.suites).add_or_update
    monkeypatch.setattr(
        type(context.suites),
        "add_or_update",
        lambda self, suite: registered.append(suite.name) or add_or_update(self, suite),
    )
    assert engine.validate(_suite(), _frame([1, 2, 3, 4]), run_name="interactions 2026-01-01").success
    first = len(registered)  # the suite, through its validation definition too
    for day in ("2026-01-02", "2026-01-03"):
        assert engine.validate(_suite(), _frame([1, 2, 3, 4]), run_name=f"interactions {day}").success
    assert first and len(registered) == first
    stricter = _suite(gxe.ExpectTableRowCountToBeBetween(min_value=10))
    assert not QualityEngine(tmp_path).validate(stricter, _frame([1, 2, 3, 4]), run_name="other").success
    # the stored suite is now the other engine's: ours is registered again, and its expectations decide
    before = len(registered)
    again = engine.validate(_suite(), _frame([1, 2, 3, 4]), run_name="interactions 2026-01-04")
    assert again.success and again.statistics["evaluated_expectations"] == 4
    assert len(registered) > before
    assert not engine.validate(stricter, _frame([1, 2, 3, 4]), run_name="stricter").success  # a changed suite too


@pytest.mark.services  # two processes
def test_two_processes_registering_suites_at_once_lose_nothing(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_validate_new_suites, args=(str(tmp_path), p)) for p in ("left", "right")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=180)
    assert [w.exitcode for w in workers] == [0, 0]
    config = (tmp_path / "gx" / "great_expectations.yml").read_text()
    for name in [f"{p}_{n}" for p in ("left", "right") for n in range(4)]:
        assert name in config, f"data asset {name} was lost from the project file"


def test_latest_results_summarise_the_newest_run_of_each_suite(tmp_path):
    engine = QualityEngine(tmp_path)
    suite = Suite("events", [gxe.ExpectColumnValuesToNotBeNull(column="x")])
    engine.validate(suite, pd.DataFrame({"x": [1, 2]}), "events day 1")
    engine.validate(suite, pd.DataFrame({"x": [1, None]}), "events day 2")
    engine.validate(Suite("users", [gxe.ExpectColumnValuesToNotBeNull(column="x")]), pd.DataFrame({"x": [1]}), "u")
    assert engine.latest_results() == [
        {"suite": "events", "run": "events day 2", "success": False, "evaluated": 1, "failed": 1},
        {"suite": "users", "run": "u", "success": True, "evaluated": 1, "failed": 0},
    ]


def test_every_declared_expectation_names_a_gx_class() -> None:
    """Suites are declared without importing GX (engines/data/expectations.py): a misspelt expectation would
    surface only when its asset validates, so every `gxe.Expect...` in the code is checked here."""
    import re

    import great_expectations.expectations as gx_expectations

    from orchestration.profiles import PROJECT_ROOT

    sources = [p for folder in ("assets", "tests") for p in (PROJECT_ROOT / folder).rglob("*.py")]
    named = {m for p in sources for m in re.findall(r"\bgxe\.(Expect\w+)\(", p.read_text())}
    assert len(named) >= 8
    assert sorted(n for n in named if not hasattr(gx_expectations, n)) == []
    with pytest.raises(ValueError, match="ExpectNoSuchThing"):
        getattr(gxe, "ExpectNoSuchThing")(column="a").build()  # noqa: B009 (the scan above skips it)


def test_runs_of_a_process_share_one_engine_whose_threads_validate_one_at_a_time(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from resources.lake import LakeResource
    from resources.quality import QualityResource

    engine = QualityResource(lake=LakeResource(root=str(tmp_path))).get_client()
    assert QualityResource(lake=LakeResource(root=str(tmp_path / "."))).get_client() is engine
    assert QualityResource(lake=LakeResource(root=str(tmp_path / "other"))).get_client() is not engine

    def validate(n: int) -> bool:
        suite = Suite(f"suite_{n % 3}", [gxe.ExpectColumnValuesToNotBeNull(column="x")])
        return engine.validate(suite, pd.DataFrame({"x": [1, 2, 3]}), f"run {n}").success

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(validate, range(8)))
    assert sorted(r["suite"] for r in engine.latest_results()) == ["suite_0", "suite_1", "suite_2"]
    stored = list((engine.root_dir / "gx" / "uncommitted" / "validations").glob("*/*/*/*.json"))
    assert len(stored) == 8
