"""`monitoring/violation_accuracy`: the violation detector's daily flags against human ground truth (the
newest content_violation release), on the random audit sample and on every labelled item. Thin: the
work is in engines/safety/violation_accuracy.py."""

import polars as pl
from dagster import AssetKey, BackfillPolicy, MaterializeResult, MetadataValue, asset

from assets.metadata import table
from assets.partitions import daily_partitions, partition_days
from engines.safety import content_violation as cv
from engines.safety import violation_accuracy as va
from resources.lake import LakeResource

KEY = AssetKey(["monitoring", "violation_accuracy"])
ZONE, TABLE = "monitoring", "violation_accuracy"


@asset(
    key=KEY,
    group_name="monitoring",
    description="Ground-truth accuracy of the violation detector: each day's flags against the newest "
    "content_violation release's verdicts of the same items: precision, recall and accuracy with 95% "
    "Wilson intervals on the random audit sample (unbiased) and on every labelled item. The flags' "
    "threshold is calibrated on the newest release, so items labelled in that release score it "
    "in-sample; a later release's audit items give the out-of-sample figure. Tracked over days: the "
    "audit figures of every measured day (the table in the lake) plotted with their intervals, a day "
    "without audit items marked.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[AssetKey([cv.FLAGS_ZONE, cv.FLAGS_TABLE]), AssetKey(["ground_truth", cv.TASK, "release"])],
    kinds={"polars", "parquet"},
    owners=["team:trust-and-safety"],
    tags={"domain": "monitoring"},
)
def violation_accuracy(context, lake: LakeResource) -> MaterializeResult:
    store = lake.get_client()
    truth = cv.release_truth(store.root)
    if truth is None:
        context.log.info("no ground-truth release yet: nothing to measure the detector against")
        empty = va.audit_history([], [])
        return MaterializeResult(
            metadata={"release": "none yet", "audit_over_days": MetadataValue.md(va.history_svg(empty))}
        )
    release = truth.release
    rows = []
    for day in partition_days(context):
        slices = va.accuracy_slices(store.read_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, day), truth.labels)
        store.write_partition(ZONE, TABLE, day, slices.with_columns(release=pl.lit(release.name)))
        rows += [{"day": day.isoformat(), **r} for r in slices.iter_rows(named=True)]
    audit = [r for r in rows if r["slice"] == cv.AUDIT]
    context.log.info(f"violation detector against release {release.name}: {rows}")
    days = store.partition_days(ZONE, TABLE)
    history = va.audit_history(days, [store.read_partition(ZONE, TABLE, d) for d in days])
    return MaterializeResult(
        metadata={
            "release": release.name,
            "by_day": table([{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows]),
            "audit_over_days": MetadataValue.md(va.history_svg(history)),
            "days_without_audit_items": int((history["items"] == 0).sum()),
            "audit/items": int(audit[-1]["items"]) if audit else 0,
            **{
                f"audit/{m}": float(audit[-1][m])
                for m in ("precision", "recall", "accuracy")
                if audit and audit[-1][m] is not None
            },
        }
    )
