"""The queues' sources, read from the lake: what the violation detector flagged, where it and the
users' abuse reports disagree, where the champion and challenger models disagree most, and a random
audit sample. Each returns the items to add (ItemIn); adding is idempotent, so re-running a day adds
nothing twice."""

from __future__ import annotations

import random
from datetime import date

import numpy as np
import polars as pl

from engines.data.lake import Lake
from engines.retrieval.embeddings import current_catalogue
from engines.safety import content_violation as cv
from ground_truth.originals import OriginalIn
from ground_truth.schema import ItemIn

FLAGGED, REPORTS, MODELS, AUDIT = "detector_flagged", "report_disagreement", "model_disagreement", "audit"
REPORT_REASON = "ip_violation"  # the report reason that means "this is a copy"


def latest_flags(lake: Lake, through: date) -> pl.DataFrame:
    """The newest detector verdict of every item flagged-or-not on a day up to `through`."""
    days = [d for d in lake.partition_days(cv.FLAGS_ZONE, cv.FLAGS_TABLE) if d <= through]
    if not days:
        return pl.DataFrame(schema={"item_id": pl.Int64, "similarity": pl.Float32, "flagged": pl.Boolean})
    frames = [lake.read_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, d).with_columns(day=pl.lit(d)) for d in days]
    return (
        pl.concat(frames, how="diagonal_relaxed")
        .sort("day")
        .unique("item_id", keep="last")
        .select("item_id", "similarity", "flagged")
    )


def matched_originals(lake: Lake, day: date, item_ids: list[int]) -> list[OriginalIn]:
    """The copy detector's newest match (as of `day`) of each of these items: the earlier item of another
    creator it resembles most, as the annotator sees it beside the item (title, thumbnail, similarity).
    Items without a match are left out."""
    days = [d for d in lake.partition_days(cv.FLAGS_ZONE, cv.FLAGS_TABLE) if d <= day]
    frames = [lake.read_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, d).with_columns(day=pl.lit(d)) for d in days]
    frames = [f for f in frames if "original_id" in f.columns]
    if not frames or not item_ids:
        return []
    matches = (
        pl.concat(frames, how="diagonal_relaxed")
        .filter(pl.col("item_id").is_in(item_ids))
        .sort("day")
        .unique("item_id", keep="last")
        .filter(pl.col("original_id").is_not_null(), pl.col("similarity").is_not_null())
    )
    catalogue = current_catalogue(lake, through=day)
    if matches.is_empty() or catalogue.is_empty():
        return []
    originals = catalogue.select(
        pl.col("item_id").alias("original_id"),
        pl.col("title").alias("original_title"),
        pl.col("thumbnail_path").alias("original_thumbnail"),
    )
    return [
        OriginalIn(
            key=str(r["item_id"]),
            original_key=str(r["original_id"]),
            original_title=r["original_title"] or "",
            original_thumbnail=r["original_thumbnail"],
            similarity=float(r["similarity"]),
        )
        for r in matches.join(originals, on="original_id", how="inner").iter_rows(named=True)
    ]


def flagged_items(lake: Lake, day: date) -> pl.DataFrame:
    """item_id, similarity of the items the detector flagged on `day`."""
    if not lake.partition_path(cv.FLAGS_ZONE, cv.FLAGS_TABLE, day).exists():
        return pl.DataFrame(schema={"item_id": pl.Int64, "similarity": pl.Float32})
    return lake.read_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, day).filter("flagged").select("item_id", "similarity")


def report_disagreements(lake: Lake, day: date, flags: pl.DataFrame) -> pl.DataFrame:
    """item_id, reason: items users reported as copies on `day` that the detector does not flag, and
    items the detector flagged on `day` that no user has reported up to then. `flags` is
    `latest_flags(lake, day)`, read once by the caller."""
    report_days = [d for d in lake.partition_days("warehouse", "abuse_reports") if d <= day]
    reports = lake.scan_partitions("warehouse", "abuse_reports", report_days)
    reports = (
        reports.filter(pl.col("reason") == REPORT_REASON, pl.col("item_id").is_not_null())
        .select("item_id", pl.col("event_timestamp").dt.date().alias("day"))
        .collect()
        if reports is not None
        else pl.DataFrame(schema={"item_id": pl.Int64, "day": pl.Date})
    )
    flagged = set(flags.filter("flagged")["item_id"].to_list())
    reported_today = set(reports.filter(pl.col("day") == day)["item_id"].to_list())
    reported_ever = set(reports["item_id"].to_list())
    missed = sorted(reported_today - flagged)
    unreported = sorted(set(flagged_items(lake, day)["item_id"].to_list()) - reported_ever)
    return pl.DataFrame(
        {
            "item_id": missed + unreported,
            "reason": ["reported_not_flagged"] * len(missed) + ["flagged_not_reported"] * len(unreported),
        },
        schema={"item_id": pl.Int64, "reason": pl.String},
    )


def audit_sample(lake: Lake, day: date, size: int) -> list[int]:
    """A uniform random sample of the catalogue as of `day`, the same for the same day (seeded by it)."""
    catalogue = current_catalogue(lake, through=day)
    ids = sorted(catalogue["item_id"].to_list()) if catalogue.height else []
    return sorted(random.Random(day.toordinal()).sample(ids, min(size, len(ids))))


def catalogue_items(
    lake: Lake, day: date, item_ids: list[int], queue: str, scores: dict[int, float], priority: float
) -> list[ItemIn]:
    """The items as an annotator sees them: title, description, thumbnail (relative to landing/)."""
    catalogue = current_catalogue(lake, through=day)
    if not item_ids or catalogue.is_empty():
        return []
    rows = catalogue.filter(pl.col("item_id").is_in(item_ids)).iter_rows(named=True)
    return [
        ItemIn(
            key=str(r["item_id"]),
            queue=queue,
            title=r["title"] or "",
            description=r["description"] or "",
            thumbnail=r["thumbnail_path"],
            model_score=scores.get(r["item_id"]),
            priority=priority,
        )
        for r in rows
    ]


def most_disputed_pairs(rows: pl.DataFrame, champion: np.ndarray, challenger: np.ndarray, top: int) -> pl.DataFrame:
    """user_id, item_id, champion, challenger, gap: the `top` distinct pairs whose click probabilities under
    the two models differ most."""

    def probability(logits: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-logits))

    scored = rows.select("user_id", "item_id").with_columns(
        champion=pl.Series(probability(champion)), challenger=pl.Series(probability(challenger))
    )
    return (
        scored.with_columns(gap=(pl.col("champion") - pl.col("challenger")).abs())
        .unique(["user_id", "item_id"], keep="first")
        .sort("gap", descending=True)
        .head(top)
    )
