"""The ground-truth assets through Dagster on a simulated lake: queues filled from the real sources
(idempotently), simulated annotators labelling through the HTTP API, review, and versioned releases
behind blocking checks, checked against the simulator's answer key and raw landing files."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import polars as pl
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance, materialize

from assets import all_assets
from engines.data.lake import Lake
from engines.data.releases import newest_release, releases
from engines.safety import content_violation as cv
from ground_truth import queue, review
from ground_truth.schema import ItemIn
from orchestration.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from orchestration.profiles import resources_for
from tests.conftest import FIRST_DAY, LAST_DAY
from tests.ground_truth.conftest import label_everything

QUEUE = AssetSelection.assets(["ground_truth", "content_violation", "queue"])
RELEASE = AssetSelection.assets(["ground_truth", "content_violation", "release"])
SECOND_DAY = FIRST_DAY + timedelta(days=1)


def run(data_dir, selection, partitioned=True, run_config=None, raise_on_error=True):
    tags = (
        {ASSET_PARTITION_RANGE_START_TAG: FIRST_DAY.isoformat(), ASSET_PARTITION_RANGE_END_TAG: LAST_DAY.isoformat()}
        if partitioned
        else {}
    )
    return materialize(
        all_assets,
        selection=selection,
        resources=resources_for("local", data_dir=str(data_dir)),
        instance=DagsterInstance.ephemeral(),
        tags=tags,
        run_config=run_config,
        raise_on_error=raise_on_error,
    )


def metadata(result, *key):
    return next(
        e.materialization for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(list(key))
    ).metadata


@pytest.fixture(scope="module")
def lake(pipeline_dir, tmp_path_factory):
    """The shared pipeline's warehouse and thumbnails copied into a lake of our own, with the detector's
    flags of the second day standing in as an upstream dataset (the detector itself is tested with CLIP in
    tests/assets/test_embeddings.py): the five lowest item ids of that day flagged."""
    data_dir = tmp_path_factory.mktemp("gt_lake")
    for folder in ("warehouse", "sim_truth", "landing/thumbnails", "landing/abuse_reports"):
        shutil.copytree(pipeline_dir / folder, data_dir / folder)
    store = Lake(data_dir)
    day_items = store.read_partition("warehouse", "items", SECOND_DAY)["item_id"].sort()
    flags = pl.DataFrame(
        {
            "item_id": day_items,
            "nearest_reference_id": day_items[0],
            "similarity": 0.5,
            "flagged": day_items.is_in(day_items.head(5).implode()),
            "model_version": "stand-in",
        },
        schema_overrides={"similarity": pl.Float32},
    )
    store.write_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, SECOND_DAY, flags)
    return data_dir


def raw_reported_items(data_dir, day) -> set[int]:
    """Items reported as copies on `day`, straight from the landing files."""
    rows = []
    for path in sorted((data_dir / "landing" / "abuse_reports").glob(f"date={day}/*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return {r["item_id"] for r in rows if r["reason"] == "ip_violation" and r["item_id"] is not None}


def test_queues_fill_from_real_sources_idempotently(lake):
    first = run(lake, QUEUE)
    meta = metadata(first, "ground_truth", "content_violation", "queue")
    assert meta["days_without_flags"].value == f"{FIRST_DAY}, {LAST_DAY}"
    engine = resources_for("local", data_dir=str(lake))["labels"].get_client()
    task = queue.get_task(engine, "content_violation")
    sources = {s.key: set(s.queues) for s in review.item_states(engine, task)}
    flagged = {k for k, q in sources.items() if "detector_flagged" in q}
    day_two = Lake(lake).read_partition("warehouse", "items", SECOND_DAY)["item_id"].sort().head(5)
    assert flagged == {str(i) for i in day_two.to_list()}
    reported = set().union(*(raw_reported_items(lake, FIRST_DAY + timedelta(days=d)) for d in range(3)))
    ever_before = set()
    expected = set()
    for d in range(3):
        day = FIRST_DAY + timedelta(days=d)
        ever_before |= raw_reported_items(lake, day)
        expected |= raw_reported_items(lake, day) - (flagged if day >= SECOND_DAY else set())
        if day == SECOND_DAY:
            expected |= {f for f in flagged if int(f) not in ever_before}
    assert reported, "the simulated days hold ip_violation reports"
    assert {k for k, q in sources.items() if "report_disagreement" in q} == {str(i) for i in expected}
    audit = {int(k) for k, q in sources.items() if "audit" in q}
    catalogue = set(pl.read_parquet(lake / "warehouse" / "items" / "*" / "*.parquet")["item_id"].to_list())
    assert 40 < len(audit) <= 3 * 20 and audit <= catalogue  # 20 a day, the days' samples may meet
    again = run(lake, QUEUE)
    assert metadata(again, "ground_truth", "content_violation", "queue")["new_items"].value == 0
    assert len(review.item_states(engine, task)) == len(sources)


def test_model_queue_records_a_missing_challenger(lake):
    result = run(lake, AssetSelection.assets(["ground_truth", "recommendation_relevance", "queue"]))
    meta = metadata(result, "ground_truth", "recommendation_relevance", "queue")
    assert meta["filled"].value == 0 and "no champion" in meta["reason"].value


def test_labels_review_and_versioned_releases(lake):
    if not releases(lake, "content_violation"):
        run(lake, QUEUE)
    blocked = run(lake, RELEASE, partitioned=False, raise_on_error=False)
    assert not blocked.success and newest_release(lake, "content_violation") is None  # nothing labelled yet
    engine, key, people, disputed = label_everything(lake)
    task = queue.get_task(engine, "content_violation")
    quality = review.task_quality(engine, task)
    # splits the annotator model cannot settle went to the reviewer; none is left open
    assert quality.disputed_open == 0 and quality.resolved == quality.items
    by_name = {a.annotator: a for a in quality.annotators}
    for person in people:  # each person's agreement with the truth, recomputed here from what they sent
        items = {s.item_id: s.key for s in review.item_states(engine, task)}
        right = sum(label == key[items[i]] for i, label in person.answers.items()) / len(person.answers)
        assert by_name[person.username].answers == len(person.answers)
        assert abs(right - person.accuracy) < 0.2
    first = run(lake, RELEASE, partitioned=False)
    meta = metadata(first, "ground_truth", "content_violation", "release")
    release = newest_release(lake, "content_violation")
    assert meta["version"].value == 1 and meta["created"].value is True
    # the loop back to the flags: the release is observed as the published release they read
    observed = [e.asset_observation_data.asset_observation for e in first.get_asset_observation_events()]
    published = [
        o for o in observed if o.asset_key == AssetKey(["ground_truth", "content_violation", "published_release"])
    ]
    assert [o.metadata["release"].value for o in published] == [release.name]
    labels = release.labels()
    manifest = release.manifest()
    assert manifest["items"] == labels.height == quality.items
    assert manifest["class_counts"] == dict(labels["label"].value_counts().iter_rows())
    correct = sum(key[r["key"]] == r["label"] for r in labels.iter_rows(named=True)) / labels.height
    assert correct > 0.9  # 4 annotators of 97-99.5% accuracy, k per item, and a reviewer
    assert set(manifest["source_queues"]) <= {"detector_flagged", "report_disagreement", "audit"}
    studio = json.loads((release.folder / "label_studio.json").read_text())
    assert len(studio) == labels.height and studio[0]["annotations"][-1]["ground_truth"] is True
    assert "Krippendorff" in (release.folder / "README.md").read_text()
    assert manifest["method"] == meta["method"].value == "dawid-skene"
    low, high = manifest["agreement"]["krippendorff_alpha_interval"]
    assert (
        low <= manifest["agreement"]["krippendorff_alpha"] <= high
        and manifest["agreement"]["krippendorff_alpha"] >= 0.667
    )
    by_how = dict(labels["resolved_by"].value_counts().iter_rows())
    assert by_how.get("verdict", 0) == disputed and sum(by_how.values()) == labels.height
    split = labels.filter(pl.col("answer_labels").list.n_unique() > 1)
    assert (split["resolved_by"] != "unanimous").all()  # a split is the reviewer's or the model's
    assert (labels.filter(pl.col("resolved_by") == "model")["posterior"] >= 0.9).all()
    files = {p.name: p.read_bytes() for p in release.folder.iterdir()}
    unchanged = run(lake, RELEASE, partitioned=False)
    assert metadata(unchanged, "ground_truth", "content_violation", "release")["created"].value is False
    assert not [s for s in review.item_states(engine, task) if s.gold_label is not None]  # none before a release
    requeued = run(lake, QUEUE)  # queue building now draws gold questions from v1
    gold = {s.key: s.gold_label for s in review.item_states(engine, task) if s.gold_label is not None}
    assert metadata(requeued, "ground_truth", "content_violation", "queue")["new_gold_questions"].value == len(gold)
    assert len(gold) == round(0.1 * len(review.item_states(engine, task)))
    assert gold == {k: v for k, v in dict(labels.select("key", "label").iter_rows()).items() if k in gold}
    strict = run(
        lake,
        RELEASE,
        partitioned=False,
        raise_on_error=False,
        run_config={"ops": {"ground_truth__content_violation__release": {"config": {"min_agreement": 0.999}}}},
    )
    assert not strict.success
    queued = {s.key for s in review.item_states(engine, task)}
    late = next(k for k in sorted(key, key=int) if k not in queued)
    queue.add_items(engine, task, [ItemIn(key=late, queue="audit", title="a late addition")])
    label_everything(lake, {"ann0": 1.0, "ann1": 1.0, "ann2": 1.0})
    second = run(lake, RELEASE, partitioned=False)
    assert metadata(second, "ground_truth", "content_violation", "release")["version"].value == 2
    assert {p.name: p.read_bytes() for p in release.folder.iterdir()} == files  # v1 untouched
