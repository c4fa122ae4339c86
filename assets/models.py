"""Trained models. The personalization model is a plain training function made into a scheduled,
registered, gated pipeline by `assets.pipelines.training_pipeline`."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from functools import partial

import polars as pl
from dagster import AllPartitionMapping, AssetDep, AssetKey, MetadataValue, TimeWindowPartitionMapping

from assets.datasets import DATASETS_ZONE, TRAINING_SET
from assets.datasets import KEY as TRAINING_SET_KEY
from assets.embeddings import ITEM_EMBEDDINGS
from assets.metadata import table
from assets.partitions import daily_partitions
from assets.pipelines import TrainedModel, TrainingRun, training_pipeline
from engines.data.lake import Lake
from engines.data.releases import RELEVANCE_TASK, releases_tag, relevance_labels
from engines.features.point_in_time import item_embeddings_as_of
from engines.models import human_relevance
from engines.retrieval.embeddings import EMBEDDINGS_ZONE, ITEMS_TABLE, latest_item_embeddings
from feature_defs import personalization_ranking
from feature_defs.compile.polars import TIMESTAMP, day_end
from ml import evaluation
from ml import personalization as model_code
from ml.plots import loss_curve_png

RANK_K = 10


# The newest recommendation_relevance release as the model's evaluation finds it in the lake (an observable
# source asset, assets/ground_truth.py): the release's queue draws on the model, a loop shown this way
PUBLISHED_RELEVANCE_RELEASE = AssetKey(["ground_truth", RELEVANCE_TASK, "published_release"])

# Every item's embeddings (all partitions of embeddings/items), read as of a time.
READS_ITEM_EMBEDDINGS = AssetDep(ITEM_EMBEDDINGS, partition_mapping=AllPartitionMapping())

GATED_METRICS = ("auc", "recall@10", "ndcg@10")  # the model must beat the popularity baseline on each
# ... and be shown better, by the paired bootstrap over users, than the champion on each of these (ranking a
# user's list is the model's job; AUC alone can rise while the lists do not)
RANKING_METRICS = ("recall@10", "ndcg@10")
# Whether it must also be shown better than the taste-cluster mixture on them. The comparison is always in the
# beats_baseline check's table; while the model does not beat the mixture, gating on it would refuse every
# version, the first included, and leave nothing to serve (docs/benchmarks.md, "Model quality").
GATE_ON_STRONG_BASELINE = False


def clip_image_vectors(lake: Lake, as_of: datetime) -> pl.DataFrame | None:
    """Every item's CLIP image embedding as known at `as_of` (engines.features.point_in_time); None when the
    embeddings pipeline has produced none."""
    if not lake.partition_days(EMBEDDINGS_ZONE, ITEMS_TABLE):
        return None
    items = latest_item_embeddings(lake.root).select("item_id")
    frame = item_embeddings_as_of(lake.root, items.with_columns(pl.lit(as_of).alias(TIMESTAMP)))
    return frame.drop_nulls("item_embedding").select("item_id", "item_embedding")


def with_embeddings_as_of(lake: Lake, rows: pl.DataFrame) -> pl.DataFrame:
    """Training rows with the item's embedding as of the row's time (null before its first one)."""
    if not lake.partition_days(EMBEDDINGS_ZONE, ITEMS_TABLE):
        return rows
    return item_embeddings_as_of(lake.root, rows)


@training_pipeline(
    "personalization",
    description="Two-tower retrieval model (torch, Ray Train) over the point-in-time training set: trained "
    "daily on the newest partitions, evaluated on the newest day held out (AUC, recall@10, "
    "NDCG@10 beside two baselines: popularity and the taste-cluster mixture of ml.taste_clusters), registered in "
    "MLflow as `challenger`; promoted only when it beats popularity on all three, is shown better than the "
    "taste-cluster mixture and than the champion on recall@10 and NDCG@10 (paired bootstrap over users, on the "
    "same held-out rows; a tie stays a challenger) and is not worse than the champion by more than the promotion "
    "margin on any of the three (AUC: DeLong). Beside them, agreement with human judgement: the AUC of the model "
    "and of popularity over the (user, item) pairs the newest recommendation_relevance release labels, with "
    "the release, recorded in the version's lineage (tag mlplane.ground_truth_releases); 'no release' before one.",
    deps=[
        AssetDep(
            TRAINING_SET_KEY,
            partition_mapping=TimeWindowPartitionMapping(
                start_offset=-6, end_offset=0, allow_nonexistent_upstream_partitions=True
            ),
        ),
        READS_ITEM_EMBEDDINGS,
        PUBLISHED_RELEVANCE_RELEASE,
    ],
    partitions_def=daily_partitions,
)
def train_personalization(run: TrainingRun) -> TrainedModel:
    days = training_days(run)
    train_rows, held_out = evaluation.split_held_out(training_rows(run, days))
    # candidates of the held-out day are ranked with the embeddings known when it began
    embeddings = clip_image_vectors(run.lake, day_end(days[-2]))
    config = model_code.TrainConfig(
        num_workers=run.num_workers, use_gpu=run.use_gpu, cpus_per_worker=run.cpus_per_worker
    )
    run.log(
        f"training on {train_rows.height} rows ({days[0]}..{days[-2]}), holding out {held_out.height} of {days[-1]}"
    )
    result = model_code.train(train_rows, config, run.workdir / "ray", embeddings)
    scores = evaluation.evaluate(result.model, train_rows, held_out, RANK_K, embeddings)
    mine = evaluation.held_out_scores(result.model, train_rows, held_out, RANK_K, embeddings)
    strong = evaluation.paired_comparisons(evaluation.taste_cluster_scores(train_rows, held_out, RANK_K), mine)
    labels = relevance_labels(run.lake.root)
    human = human_relevance.model_human_relevance(result.model, train_rows, held_out, labels, embeddings)
    run.log(f"human relevance ({human['model']['release']}): {human}")
    model_dir = result.model.save(run.workdir / "model")
    loss_curve_png(result.loss_curve, model_dir / "loss_curve.png")
    return TrainedModel(
        model_dir=model_dir,
        metrics=personalization_metrics(scores, result, human),
        gate_metric=tuple(_metric_name("model", m) for m in RANKING_METRICS),
        baseline={_metric_name("model", m): scores["popularity"][m] for m in GATED_METRICS},
        baseline_comparisons={f"{_metric_name('model', m)} vs taste_clusters": strong[m] for m in RANKING_METRICS},
        gate_on_comparisons=GATE_ON_STRONG_BASELINE,
        # the platform's own model: its served features feed the training-serving skew check
        log_inputs=True,
        compare=partial(compare_with_champion, train_rows, held_out, embeddings, mine),
        data_partitions=[d.isoformat() for d in days],
        feature_service=personalization_ranking.name,
        lineage=releases_tag(labels.release if labels is not None else None),
        params={
            "dim": str(config.dim),
            "epochs": str(config.epochs),
            "workers": str(config.num_workers),
            "item_embeddings": str(embeddings is not None),
            "selected_epoch": str(result.selected_epoch),
        },
        metadata={
            **training_metadata(scores, result, train_rows),
            "held_out_rows": held_out.height,
            **human_relevance_metadata(human),
            "uses_item_embeddings": embeddings is not None,
        },
    )


def training_days(run: TrainingRun) -> list[date]:
    """The training set's days in the run's window, the last one held out; two at least."""
    days = [
        d
        for d in run.lake.partition_days(DATASETS_ZONE, TRAINING_SET)
        if run.day - timedelta(days=run.training_days - 1) <= d <= run.day
    ]
    if len(days) < 2:
        raise ValueError(f"personalization needs two or more days of {TRAINING_SET} up to {run.day}, found {days}")
    return days


def training_rows(run: TrainingRun, days: list[date]) -> pl.DataFrame:
    """The training set's rows of `days`, each with its item's embedding as of the row's time."""
    scanned = run.lake.scan_partitions(DATASETS_ZONE, TRAINING_SET, days)
    if scanned is None:  # the days come from the lake's own listing of the table
        raise ValueError(f"no partitions of {TRAINING_SET} for {days}")
    return with_embeddings_as_of(run.lake, scanned.collect())


def compare_with_champion(train_rows, held_out, embeddings, mine, champion_dir) -> dict:
    """The champion (a) and this model (b, its held-out scores `mine`) on the same held-out rows."""
    champion = model_code.PersonalizationModel.load(champion_dir)
    theirs = evaluation.held_out_scores(champion, train_rows, held_out, RANK_K, embeddings)
    return {_metric_name("model", m): c for m, c in evaluation.paired_comparisons(theirs, mine).items()}


def personalization_metrics(scores: dict[str, dict], result, human: dict[str, dict]) -> dict[str, float]:
    """The metrics registered with the model: every scorer's held-out scores, the final loss, the human AUCs."""
    metrics = {_metric_name(name, key): value for name, values in scores.items() for key, value in values.items()}
    metrics["final_train_loss"] = result.loss_curve[-1]
    metrics.update({_metric_name(n, "human_auc"): v["auc"] for n, v in human.items() if isinstance(v["auc"], float)})
    return metrics


def training_metadata(scores: dict[str, dict], result, train_rows: pl.DataFrame) -> dict:
    """The UI's view of the training: held-out scores, the loss curve and the epoch kept."""
    return {
        "held_out_metrics": table(
            [{"scorer": name, **{k: round(v, 4) for k, v in values.items()}} for name, values in scores.items()]
        ),
        "loss_curve": MetadataValue.md(
            "| epoch | train loss |\n|---|---|\n"
            + "\n".join(f"| {i + 1} | {loss:.4f} |" for i, loss in enumerate(result.loss_curve))
        ),
        "training_rows": train_rows.height,
        # model selection (ml.epoch_selection): the validation day's score per epoch, 0 the untrained start
        "epoch_selection": MetadataValue.md(
            "| epoch | validation (mean of recall@10 and NDCG@10) | kept |\n|---|---|---|\n"
            + "\n".join(
                f"| {i} | {score:.4f} | {'yes' if i == result.selected_epoch else ''} |"
                for i, score in enumerate(result.validation_scores)
            )
        ),
        "validation_rows": result.validation_rows,
        # rows read before a daily view's first run: item attributes filled, the rest counted
        "feature_coverage": table([{"measure": k, "rows": v} for k, v in result.coverage.items()]),
    }


def human_relevance_metadata(human: dict[str, dict]) -> dict:
    """The human-relevance metrics as the UI shows them: the release, the model's AUC (a number, or why
    there is none) and a table of every scorer's."""
    model = human["model"]
    auc = model["auc"]
    return {
        "human_relevance_release": model["release"],
        "human_relevance_auc": MetadataValue.float(round(auc, 4)) if isinstance(auc, float) else auc,
        "human_relevance_pairs": model["pairs"],
        "human_relevance": table([{"scorer": name, **_rounded(metrics)} for name, metrics in human.items()]),
    }


def _rounded(values: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in values.items()}


def _metric_name(scorer: str, metric: str) -> str:
    return f"{scorer}_{metric}".replace("@", "_at_")


model_assets = [*train_personalization.assets]
