"""Ground truth: the daily queue-filling assets (detector flags, detector-vs-reports disagreements,
champion-vs-challenger disagreements, a random audit sample) and the versioned releases behind
blocking great-expectations checks. Thin: the work is in ground_truth/."""

import random
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckSpec,
    AssetKey,
    AssetObservation,
    AssetSpec,
    BackfillPolicy,
    Config,
    DataVersion,
    MaterializeResult,
    ObserveResult,
    asset,
    multi_observable_source_asset,
)
from pydantic import Field

from assets.datasets import DATASETS_ZONE, TRAINING_SET
from assets.embeddings import PUBLISHED_VIOLATION_RELEASE, VIOLATION_FLAGS, WAREHOUSE_ITEMS
from assets.metadata import quality_gate, table
from assets.models import PUBLISHED_RELEVANCE_RELEASE, with_embeddings_as_of
from assets.partitions import daily_partitions, partition_days
from engines.data.expectations import Suite, gxe
from engines.data.releases import newest_release
from ground_truth import originals, queue, review
from ground_truth import release as rel
from ground_truth import sources as src
from ground_truth.schema import CONTENT_VIOLATION, RECOMMENDATION_RELEVANCE, ItemIn, TaskSpec
from ml.personalization import PersonalizationModel
from resources.labels import LabelStoreResource
from resources.lake import LakeResource
from resources.quality import QualityResource
from resources.registry import ModelRegistryResource

MODEL = "personalization"
PRIORITY = {src.FLAGGED: 3.0, src.REPORTS: 2.0, src.AUDIT: 1.0}
GOLD_POSTERIOR = 0.95  # a released label becomes a gold key only when the annotator model is this sure


def queue_key(spec: TaskSpec) -> AssetKey:
    return AssetKey(["ground_truth", spec.name, "queue"])


def release_key(spec: TaskSpec) -> AssetKey:
    return AssetKey(["ground_truth", spec.name, "release"])


# each task's release as its readers find it in the lake (an observable source asset below)
PUBLISHED_RELEASES = {
    CONTENT_VIOLATION.name: PUBLISHED_VIOLATION_RELEASE,
    RECOMMENDATION_RELEVANCE.name: PUBLISHED_RELEVANCE_RELEASE,
}


def published_release_metadata(lake_root: Path, task: str = CONTENT_VIOLATION.name) -> tuple[DataVersion, dict]:
    newest = newest_release(lake_root, task)
    if newest is None:
        return DataVersion("none"), {"release": "none yet"}
    return DataVersion(newest.name), {"release": newest.name, "path": str(newest.folder)}


OBSERVED = " Observed by the release asset each time it runs, and by observing it; data version: the release's name."


def published_release_source(task: str, owner: str, description: str):
    """The newest release of `task` as its readers find it in the lake, as an observable source asset: a
    reader upstream of the release's own queue declares it without making a cycle."""
    key = PUBLISHED_RELEASES[task]

    @multi_observable_source_asset(
        name="__".join(key.path),
        specs=[
            AssetSpec(
                key,
                group_name="ground_truth",
                description=description + OBSERVED,
                owners=[owner],
                tags={"domain": "ground_truth"},
                kinds={"parquet"},
            )
        ],
    )
    def observe(lake: LakeResource):
        version, metadata = published_release_metadata(Path(lake.root), task)
        yield ObserveResult(asset_key=key, data_version=version, metadata=metadata)

    return observe


published_violation_release = published_release_source(
    CONTENT_VIOLATION.name,
    "team:trust-and-safety",
    "The newest content_violation release as its readers find it in the lake: the copy flags calibrate on it "
    "and the queue draws gold questions from it. The release is written by ground_truth/content_violation/"
    "release, downstream of the queue the flags feed (the labeling loop: flags -> queue -> release -> next "
    "flags); this observable source closes the loop without a cycle.",
)
published_relevance_release = published_release_source(
    RECOMMENDATION_RELEVANCE.name,
    "team:ml-platform",
    "The newest recommendation_relevance release as the personalization model's evaluation finds it in the "
    "lake: its human labels score the model's ranking (AUC over the labelled pairs) and its version is "
    "recorded in every model version it fed. The release is written by ground_truth/recommendation_relevance/"
    "release, downstream of the queue the model's champion and challenger fill; this observable source closes "
    "that loop without a cycle.",
)


class ViolationQueueConfig(Config):
    audit_size: int = Field(
        default=20,
        ge=0,
        description="Random catalogue items per day for the audit queue (an unbiased accuracy estimate needs one)",
    )


@asset(
    key=queue_key(CONTENT_VIOLATION),
    group_name="ground_truth",
    description="Fills the content_violation labeling task each day from three queues: items the violation "
    "detector flagged, items where it and the users' ip_violation reports disagree, and a random "
    "audit sample of the catalogue. Then gold questions: random items of the newest release (adjudicated "
    "or unanimous) get their released label as a known answer, until the task's gold_share of its items "
    "carry one. Last, the annotator model is refitted (the queue of an adaptive task asks by it). "
    "Idempotent: an item is added once, a re-run adds nothing.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),  # a range runs as one run (partition_days)
    deps=[VIOLATION_FLAGS, AssetKey(["warehouse", "abuse_reports"]), WAREHOUSE_ITEMS, PUBLISHED_VIOLATION_RELEASE],
    kinds={"sqlite", "postgres"},
    owners=["team:trust-and-safety"],
    tags={"domain": "ground_truth"},
)
def content_violation_queue(
    context, config: ViolationQueueConfig, lake: LakeResource, labels: LabelStoreResource
) -> MaterializeResult:
    store, engine = lake.get_client(), labels.get_client()
    task = queue.create_task(engine, CONTENT_VIOLATION)
    rows, missing_flags = [], []
    for day in partition_days(context):
        if not store.partition_path("content_violations", "flags", day).exists():
            missing_flags.append(day.isoformat())  # said in metadata: (a) is empty, (b) sees no flags
        flags = src.latest_flags(store, day)
        scores = {
            r["item_id"]: float(r["similarity"]) for r in flags.iter_rows(named=True) if r["similarity"] is not None
        }  # before the first release nothing has a score
        picked = {
            src.FLAGGED: src.flagged_items(store, day)["item_id"].to_list(),
            src.REPORTS: src.report_disagreements(store, day, flags)["item_id"].to_list(),
            src.AUDIT: src.audit_sample(store, day, config.audit_size),
        }
        for name, ids in picked.items():
            added = queue.add_items(engine, task, src.catalogue_items(store, day, ids, name, scores, PRIORITY[name]))
            rows.append({"day": day.isoformat(), "queue": name, "candidates": len(ids), "new_items": added})
        # the annotator judges each item beside the original the detector matched it with
        originals.record(
            engine, task, src.matched_originals(store, day, sorted({i for ids in picked.values() for i in ids}))
        )
        context.log.info(f"content_violation queue {day}: {rows[-3:]}")
    gold = _gold_from_newest_release(Path(lake.root), engine, task, context)
    _, slots = review.refresh_model(engine, task)  # new items and gold answers: refit, rebalance adaptive slots
    quality = review.task_quality(engine, task)
    return MaterializeResult(
        metadata={
            "new_items": sum(r["new_items"] for r in rows),
            "new_gold_questions": gold,
            "slots_added": slots["slots_added"],
            "slots_removed": slots["slots_removed"],
            "task_items": quality.items,
            "days_without_flags": ", ".join(missing_flags) or "none",
            "queues": table(rows),
            "label_store": labels.database_url().split("@")[-1],
        }
    )


def _gold_from_newest_release(lake_root: Path, engine, task: queue.Task, context) -> int:
    """Gold questions drawn at random from the newest release's verdicts and confident labels (none before
    the first release)."""
    newest = newest_release(lake_root, task.spec.name)
    if newest is None:
        return 0
    labels = newest.labels()
    if "posterior" in labels.columns:  # a key scores everyone: verdicts, and labels the model is sure of
        labels = labels.filter((pl.col("resolved_by") == "verdict") | (pl.col("posterior") >= GOLD_POSTERIOR))
    known = dict(labels.select("key", "label").iter_rows())
    added = queue.set_gold(engine, task, known, random.Random(f"{task.spec.name}:{newest.version}:{len(known)}"))
    context.log.info(f"{task.spec.name}: {added} new gold questions from release {newest.name}")
    return added


class ModelQueueConfig(Config):
    top: int = Field(default=20, ge=1, description="Pairs per day where the two models disagree most")


@asset(
    key=queue_key(RECOMMENDATION_RELEVANCE),
    group_name="ground_truth",
    description="Fills the recommendation_relevance task each day with the user-item pairs of the day's "
    "training rows whose click probability differs most between the personalization champion "
    "and challenger. Without a challenger distinct from the champion it fills nothing and says so.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),  # a range runs as one run (partition_days)
    deps=[AssetKey(["datasets", TRAINING_SET]), AssetKey(["models", f"{MODEL}_champion"])],
    kinds={"pytorch", "sqlite", "postgres"},
    owners=["team:ml-platform"],
    tags={"domain": "ground_truth"},
)
def recommendation_queue(
    context,
    config: ModelQueueConfig,
    lake: LakeResource,
    labels: LabelStoreResource,
    model_registry: ModelRegistryResource,
) -> MaterializeResult:
    registry, store = model_registry.get_client(), lake.get_client()
    champion, challenger = registry.by_alias(MODEL, "champion"), registry.by_alias(MODEL, "challenger")
    if champion is None or challenger is None or champion.version == challenger.version:
        why = (
            f"no champion of {MODEL!r}"
            if champion is None
            else f"no challenger of {MODEL!r} distinct from the champion (v{champion.version})"
        )
        context.log.info(f"recommendation queue: {why}; nothing filled")
        return MaterializeResult(metadata={"filled": 0, "reason": why})
    models = {}
    with tempfile.TemporaryDirectory(prefix="gt-models-") as work:
        for alias, version in (("champion", champion), ("challenger", challenger)):
            models[alias] = PersonalizationModel.load(registry.load(MODEL, version.version, Path(work) / alias))
    engine = labels.get_client()
    task = queue.create_task(engine, RECOMMENDATION_RELEVANCE)
    days = []
    for day in partition_days(context):
        if not store.partition_path(DATASETS_ZONE, TRAINING_SET, day).exists():
            days.append({"day": day.isoformat(), "pairs": 0, "new_items": 0, "largest_gap": 0.0})
            continue
        rows = store.read_partition(DATASETS_ZONE, TRAINING_SET, day)
        with_embeddings = with_embeddings_as_of(store, rows)  # as of each row's time, as in training
        scored = {a: m.score(with_embeddings if m.spec.item.embedding_column else rows) for a, m in models.items()}
        pairs = src.most_disputed_pairs(rows, scored["champion"], scored["challenger"], config.top)
        added = queue.add_items(engine, task, _pair_items(store, day, pairs))
        days.append(
            {
                "day": day.isoformat(),
                "pairs": pairs.height,
                "new_items": added,
                "largest_gap": round(float(pairs["gap"].max() or 0.0), 4),
            }
        )
    return MaterializeResult(
        metadata={
            "filled": sum(d["new_items"] for d in days),
            "champion": champion.version,
            "challenger": challenger.version,
            "days": table(days),
        }
    )


def _pair_items(store, day, pairs: pl.DataFrame) -> list[ItemIn]:
    items = {i.key: i for i in src.catalogue_items(store, day, pairs["item_id"].to_list(), src.MODELS, {}, 0.0)}
    return [
        ItemIn(
            key=f"{r['user_id']}:{r['item_id']}",
            queue=src.MODELS,
            title=items[str(r["item_id"])].title,
            description=f"For user {r['user_id']}. {items[str(r['item_id'])].description}",
            thumbnail=items[str(r["item_id"])].thumbnail,
            model_score=round(r["champion"], 4),
            priority=float(r["gap"]),
        )
        for r in pairs.iter_rows(named=True)
        if str(r["item_id"]) in items
    ]


class ReleaseConfig(Config):
    min_agreement: float | None = Field(
        default=None,
        description="Lowest Krippendorff's alpha a release may have; default the task's min_alpha (0.667, "
        "Krippendorff's floor for tentative conclusions, unless the task says otherwise)",
    )
    min_class_share: float = Field(default=0.01, description="Smallest share any label may have")
    max_class_share: float = Field(default=0.99, description="Largest share any label may have")
    min_items: int = Field(default=1, ge=1)


def release_suite(spec: TaskSpec, config: ReleaseConfig) -> Suite:
    return Suite(
        f"ground_truth_{spec.name}_release",
        [
            gxe.ExpectColumnValuesToBeBetween(column="items", min_value=config.min_items),
            gxe.ExpectColumnValuesToBeBetween(
                column="krippendorff_alpha",
                min_value=spec.min_alpha if config.min_agreement is None else config.min_agreement,
            ),
            gxe.ExpectColumnValuesToNotBeNull(column="krippendorff_alpha"),
            gxe.ExpectColumnValuesToBeBetween(column="unresolved_disagreements", min_value=0, max_value=0),
            gxe.ExpectColumnValuesToBeBetween(column="smallest_class_share", min_value=config.min_class_share),
            gxe.ExpectColumnValuesToBeBetween(column="largest_class_share", max_value=config.max_class_share),
        ],
    )


def release_asset(spec: TaskSpec):
    key = release_key(spec)

    @asset(
        key=key,
        group_name="ground_truth",
        description=f"A versioned, immutable release of the {spec.name} labels (a reviewer's verdict, else the "
        "Dawid-Skene annotator model's label at the task's confidence, else a unanimous answer), each with "
        "its posterior: Parquet, manifest (agreement with its bootstrap interval, the annotator model, "
        "flagged annotators), dataset card and Label Studio import, written only when the blocking checks "
        "pass (alpha floor, no open disagreement, class balance). Unchanged labels make no new version.",
        deps=[queue_key(spec)],  # the loop back to its readers: its published_release
        kinds={"parquet"},
        owners=["team:ground-truth"],
        tags={"domain": "ground_truth"},
        check_specs=[
            AssetCheckSpec(
                "great_expectations",
                asset=key,
                blocking=True,
                description="Minimum agreement, no unresolved disagreement, class balance",
            )
        ],
    )
    def _release(
        context, config: ReleaseConfig, lake: LakeResource, labels: LabelStoreResource, quality: QualityResource
    ):
        found, summary = release_candidate(labels.get_client(), spec)
        yield from quality_gate(
            quality, release_suite(spec, config), {datetime.now(UTC).date(): summary}, f"release of {spec.name}"
        )
        checks = summary.to_dicts()[0]
        release, created = rel.write_release(Path(lake.root), found, checks)
        context.log.info(f"{spec.name} release {release.name}: {'written' if created else 'unchanged'}")
        if spec.name in PUBLISHED_RELEASES:  # what its readers (the next flags, the next model) will read
            _, published = published_release_metadata(Path(lake.root), spec.name)
            context.log_event(AssetObservation(asset_key=PUBLISHED_RELEASES[spec.name], metadata=published))
        yield MaterializeResult(metadata=release_metadata(release, created))

    return _release


def release_candidate(engine, spec: TaskSpec) -> tuple[rel.Candidate, pl.DataFrame]:
    """The release the task's labels make now (the annotator model refreshed first), and its one-row
    summary for the quality gate, with the largest class's share."""
    task = queue.get_task(engine, spec.name)
    model, _ = review.refresh_model(engine, task)
    states = review.item_states(engine, task)
    found = rel.candidate(task, states, review.task_quality(engine, task, states, model), model)
    summary = found.summary().with_columns(
        largest_class_share=pl.lit(max(found.class_balance().values(), default=None), dtype=pl.Float64)
    )
    return found, summary


def release_metadata(release: rel.Release, created: bool) -> dict:
    """A release's manifest as the asset's metadata: version, agreement, method and counts."""
    manifest = release.manifest()
    return {
        "version": release.version,
        "created": created,
        "path": str(release.folder),
        "items": manifest["items"],
        "content_hash": manifest["content_hash"],
        "krippendorff_alpha": manifest["agreement"]["krippendorff_alpha"],
        "krippendorff_alpha_interval": str(manifest["agreement"]["krippendorff_alpha_interval"]),
        "method": str(manifest["method"]),
        "answers": manifest["answers"],
        "flagged_annotators": ", ".join(manifest["flagged_annotators"]) or "none",
        "class_counts": table([{"label": k, "count": v} for k, v in sorted(manifest["class_counts"].items())]),
        "source_queues": table([{"queue": k, "items": v} for k, v in sorted(manifest["source_queues"].items())]),
        "annotators": table([{k: v for k, v in a.items()} for a in manifest["annotators"]]),
    }


ground_truth_assets = [
    content_violation_queue,
    recommendation_queue,
    release_asset(CONTENT_VIOLATION),
    release_asset(RECOMMENDATION_RELEVANCE),
]
