"""`monitoring/violation_accuracy` through Dagster: random flags of two days against a release of random
verdicts (written in the release layout: labels.parquet with each item's queues, then the manifest);
every figure recomputed here from the raw rows, intervals against Wilson's published values."""

from __future__ import annotations

import json
import random
from datetime import date, timedelta

import polars as pl
import pytest
from dagster import DagsterInstance, materialize

from assets.violation_monitoring import TABLE, ZONE, violation_accuracy
from engines.data.lake import Lake
from engines.data.releases import releases_dir
from engines.safety.violation_accuracy import Rate
from resources.lake import LakeResource

DAY = date(2026, 3, 4)


def test_wilson_intervals_match_published_values():
    # the Wilson score interval at 95%, worked by hand from its formula
    assert Rate(0, 10).interval == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert Rate(5, 10).interval == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert Rate(1, 20).interval == pytest.approx((0.0089, 0.2361), abs=1e-4)
    assert Rate(0, 0).value is None and Rate(0, 0).interval == (None, None)


def write_release(root, rows: list[dict]) -> None:
    folder = releases_dir(root, "content_violation") / "v0001"
    folder.mkdir(parents=True)
    pl.DataFrame(rows, schema={"key": pl.String, "label": pl.String, "queues": pl.List(pl.String)}).write_parquet(
        folder / "labels.parquet"
    )
    (folder / "manifest.json").write_text(json.dumps({"items": len(rows)}))


def test_flags_are_scored_against_the_release_per_slice(tmp_path):
    rng = random.Random(11)
    lake = Lake(tmp_path)
    flags = {}
    for d in range(2):
        items = list(range(d * 500, d * 500 + 400))
        flags[DAY + timedelta(days=d)] = {i: rng.random() < 0.15 for i in items}
        lake.write_partition(
            "content_violations",
            "flags",
            DAY + timedelta(days=d),
            pl.DataFrame({"item_id": items, "flagged": [flags[DAY + timedelta(days=d)][i] for i in items]}),
        )
    verdicts = {}  # item -> (is_violation, audit); some labelled items were never flagged on these days
    for item in rng.sample(range(1000), 500):
        verdicts[item] = (rng.random() < 0.2, rng.random() < 0.4)
    rows = [
        {
            "key": str(i),
            "label": "violation" if v else "ok",
            "queues": rng.choice([["audit"], ["audit", "detector_flagged"]])
            if audit
            else rng.choice([["detector_flagged"], ["report_disagreement"]]),
        }
        for i, (v, audit) in verdicts.items()
    ]
    rows.append({"key": "gold-1", "label": "violation", "queues": ["gold"]})  # not an item: left out
    write_release(tmp_path, rows)

    result = materialize(
        [violation_accuracy],
        resources={"lake": LakeResource(root=str(tmp_path))},
        instance=DagsterInstance.ephemeral(),
        tags={
            "dagster/asset_partition_range_start": str(DAY),
            "dagster/asset_partition_range_end": str(DAY + timedelta(days=1)),
        },
    )
    assert result.success
    for day, flagged in flags.items():
        table = lake.read_partition(ZONE, TABLE, day)
        assert table["release"].unique().to_list() == ["v0001"]
        for row in table.iter_rows(named=True):
            pairs = [
                (flagged[i], v)
                for i, (v, audit) in verdicts.items()
                if i in flagged and (audit or row["slice"] == "all labelled")
            ]
            tp = sum(f and v for f, v in pairs)
            assert row["items"] == len(pairs) and row["true_positives"] == tp
            assert row["flagged"] == sum(f for f, _ in pairs) and row["violations"] == sum(v for _, v in pairs)
            assert row["precision"] == pytest.approx(tp / sum(f for f, _ in pairs))
            assert row["recall"] == pytest.approx(tp / sum(v for _, v in pairs))
            assert row["accuracy"] == pytest.approx(sum(f == v for f, v in pairs) / len(pairs))
            assert row["precision_low"] <= row["precision"] <= row["precision_high"]
    metadata = result.asset_materializations_for_node("monitoring__violation_accuracy")[-1].metadata
    assert metadata["release"].value == "v0001" and "audit/recall" in metadata


def test_without_a_release_nothing_is_measured(tmp_path):
    Lake(tmp_path).write_partition(
        "content_violations", "flags", DAY, pl.DataFrame({"item_id": [1], "flagged": [True]})
    )
    result = materialize(
        [violation_accuracy],
        resources={"lake": LakeResource(root=str(tmp_path))},
        instance=DagsterInstance.ephemeral(),
        partition_key=str(DAY),
    )
    assert result.success and not Lake(tmp_path).partition_path(ZONE, TABLE, DAY).exists()


def test_audit_history_plot_renders_a_day_without_audit_items(tmp_path):
    """Three days measured in two runs, the middle one with no audit item among its flags: the plot (SVG)
    parses, marks that day, and draws each other day's precision and recall at the values in the lake's
    table with their intervals; the history spans the earlier run's day too."""
    from xml.etree import ElementTree

    lake = Lake(tmp_path)
    days = [DAY + timedelta(days=d) for d in range(3)]
    audited = {d: list(range(i * 100, i * 100 + 40)) for i, d in enumerate(days) if i != 1}
    for i, day in enumerate(days):
        items = list(range(i * 100, i * 100 + 60))
        lake.write_partition(
            "content_violations", "flags", day, pl.DataFrame({"item_id": items, "flagged": [j % 3 == 0 for j in items]})
        )
    rows = [
        {"key": str(j), "label": "violation" if j % 2 == 0 else "ok", "queues": ["audit"]}
        for items in audited.values()
        for j in items
    ]
    rows += [{"key": "150", "label": "violation", "queues": ["detector_flagged"]}]  # labelled, not audited
    write_release(tmp_path, rows)
    for first, last in ((days[0], days[0]), (days[1], days[2])):
        result = materialize(
            [violation_accuracy],
            resources={"lake": LakeResource(root=str(tmp_path))},
            instance=DagsterInstance.ephemeral(),
            tags={"dagster/asset_partition_range_start": str(first), "dagster/asset_partition_range_end": str(last)},
        )
        assert result.success
    metadata = result.asset_materializations_for_node("monitoring__violation_accuracy")[-1].metadata
    assert metadata["days_without_audit_items"].value == 1
    svg = ElementTree.fromstring(metadata["audit_over_days"].value)
    ns = "{http://www.w3.org/2000/svg}"
    marks = [t for t in svg.iter(f"{ns}text") if t.find(f"{ns}title") is not None]
    assert [m.find(f"{ns}title").text for m in marks] == ["no audit items"]
    circles = [float(c.get("cy")) for c in svg.iter(f"{ns}circle")]
    expected = []
    for day in (days[0], days[2]):
        audit = lake.read_partition(ZONE, TABLE, day).filter(pl.col("slice") == "audit").row(0, named=True)
        ids = audited[day]
        tp = sum(j % 3 == 0 and j % 2 == 0 for j in ids)
        assert audit["precision"] == pytest.approx(tp / sum(j % 3 == 0 for j in ids))
        assert audit["recall"] == pytest.approx(tp / sum(j % 2 == 0 for j in ids))
        expected += [30 + 200 * (1 - audit["precision"]), 30 + 200 * (1 - audit["recall"])]
    assert circles == pytest.approx(expected, abs=0.06)
