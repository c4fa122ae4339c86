"""Offline comparison reports of the A/B experiments in deploy/experiments.yaml: one asset per experiment;
and the experiments file itself as an observable source asset (`deploy/experiments_config`), so that the
readers of the file (the served answers, online accuracy) show it upstream in the asset graph."""

import hashlib
import tempfile
from pathlib import Path

import polars as pl
from dagster import (
    AssetKey,
    AssetSpec,
    DataVersion,
    Failure,
    MaterializeResult,
    MetadataValue,
    ObserveResult,
    asset,
    multi_observable_source_asset,
)

from assets.datasets import DATASETS_ZONE, TRAINING_SET
from assets.datasets import KEY as TRAINING_SET_KEY
from assets.metadata import table
from assets.models import READS_ITEM_EMBEDDINGS, clip_image_vectors, with_embeddings_as_of
from assets.partitions import daily_partitions, partition_days
from engines.experimentation.experiments import Experiment, load
from feature_defs.compile.polars import day_end
from ml import evaluation
from ml import personalization as model_code
from ml.comparison import judge
from resources.lake import LakeResource
from resources.registry import ModelRegistryResource

# The experiments are declared in the repository like the feature catalogue: one report asset each.
# (The model server can follow another file at run time: `mlplane serve models --experiments`.)
EXPERIMENTS_FILE = Path(__file__).resolve().parents[1] / "deploy" / "experiments.yaml"
RANK_K = 10
CONFIG_KEY = AssetKey(["deploy", "experiments_config"])


@multi_observable_source_asset(
    name="deploy__experiments_config",
    specs=[
        AssetSpec(
            CONFIG_KEY,
            group_name="serving",
            description="deploy/experiments.yaml: layers, experiments (variants, traffic, salts) and shadows, read "
            "by the model server to route requests (each answer logs the digest of the file it ran; online "
            "accuracy reads each experiment's control and split from that file, stored beside the logs) and "
            "by the offline reports. Observing it records the file's sha256 as its data version.",
            owners=["team:ml-platform"],
            tags={"domain": "serving"},
            kinds={"yaml"},
        )
    ],
)
def experiments_config():
    data = EXPERIMENTS_FILE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    found = load(EXPERIMENTS_FILE)
    yield ObserveResult(
        asset_key=CONFIG_KEY,
        data_version=DataVersion(digest),
        metadata={
            "path": MetadataValue.path(str(EXPERIMENTS_FILE)),
            "sha256": digest,
            "experiments": table([{"experiment": e.name, "model": e.model, "layer": e.layer or "-"} for e in found]),
        },
    )


def experiment_report(experiment: Experiment):
    variants = ", ".join(f"{v.name} ({v.model_ref}, {v.traffic:.0%})" for v in experiment.variants)

    @asset(
        key=AssetKey(["experiments", experiment.name]),
        group_name="experiments",
        description=f"Offline comparison for A/B experiment {experiment.name!r} on {experiment.model!r}: "
        f"{variants}. Every variant's model scores the same held-out day (all its users: offline nothing "
        f"needs splitting them), and each treatment is compared with the control on those rows (paired: AUC "
        f"by DeLong, recall and NDCG by the bootstrap over users); a leader only where one is shown better. "
        f"{experiment.description}",
        partitions_def=daily_partitions,
        deps=[TRAINING_SET_KEY, AssetKey(["models", f"{experiment.model}_champion"]), READS_ITEM_EMBEDDINGS],
        kinds={"mlflow", "pytorch"},
        owners=["team:ml-platform"],
    )
    def report(context, lake: LakeResource, model_registry: ModelRegistryResource):
        (day,) = partition_days(context)
        the_lake = lake.get_client()
        days = [d for d in the_lake.partition_days(DATASETS_ZONE, TRAINING_SET) if d <= day]
        if len(days) < 2 or days[-1] != day:
            raise Failure(f"{experiment.name}: needs {TRAINING_SET} for {day} and an earlier day, found {days}")
        # rows and their item embeddings as of each row's time (engines.features.point_in_time), as in training
        history = with_embeddings_as_of(
            the_lake, the_lake.scan_partitions(DATASETS_ZONE, TRAINING_SET, days[:-1]).collect()
        )
        held_out = with_embeddings_as_of(the_lake, the_lake.read_partition(DATASETS_ZONE, TRAINING_SET, day))
        embeddings = clip_image_vectors(the_lake, day_end(days[-2]))
        scored = score_variants(experiment, model_registry.get_client(), held_out, history, embeddings)
        margin = model_registry.promotion_margin
        paired = against_control(experiment, scored, margin)
        leader, why = leader_of(experiment, paired)
        return MaterializeResult(
            metadata={
                "comparison": table(variant_rows(experiment, held_out, scored)),
                "against_control": table(paired),
                "leader": leader,
                "leader_reason": why,
                "margin": margin,
                "salt": experiment.salt,
                "config": MetadataValue.path(str(EXPERIMENTS_FILE)),
            }
        )

    return report


def variant_rows(experiment: Experiment, held_out: pl.DataFrame, scored: list) -> list[dict]:
    """Each variant's version, traffic, the held-out users the experiment assigns it, and its metrics."""
    assigned = held_out.get_column("user_id").map_elements(  # null: a user outside its slice of the layer
        lambda u: variant.name if (variant := experiment.assign(u)) else None, return_dtype=str
    )
    return [
        {
            "variant": variant.name,
            "model": variant.model_ref,
            "version": version,
            "traffic": variant.traffic,
            "assigned_users": held_out.filter(assigned == variant.name).get_column("user_id").n_unique(),
            "users": int(len(scores.users)),
            "impressions": held_out.height,
            **{k: round(float(v), 4) for k, v in scores.metrics().items()},  # numpy floats do not serialize
        }
        for variant, (version, scores) in zip(experiment.variants, scored)
    ]


def score_variants(
    experiment: Experiment, registry, held_out, history, embeddings
) -> list[tuple[str, evaluation.HeldOutScores]]:
    """Each variant's registry version and its model's scores of all the held-out rows."""
    scored = []
    with tempfile.TemporaryDirectory(prefix="experiment-") as work:
        for variant in experiment.variants:
            version = (
                registry.by_alias(experiment.model, variant.model_alias)
                if variant.model_alias
                else registry.get(experiment.model, variant.model_version)
            )
            if version is None:
                raise Failure(
                    f"{experiment.name}: variant {variant.name!r} points at {variant.model_ref}, "
                    f"which {experiment.model!r} does not have"
                )
            folder = registry.load(experiment.model, version.version, Path(work) / variant.name)
            model = model_code.PersonalizationModel.load(folder)
            uses = embeddings if model.spec.item.embedding_column else None
            scored.append((version.version, evaluation.held_out_scores(model, history, held_out, RANK_K, uses)))
    return scored


def against_control(experiment: Experiment, scored: list, margin: float) -> list[dict]:
    """Each treatment against the control on the same rows, per metric, judged at `margin`."""
    control = scored[0][1]
    rows = []
    for variant, (_, scores) in zip(experiment.variants[1:], scored[1:]):
        for metric, c in evaluation.paired_comparisons(control, scores).items():
            verdict = judge(c, margin=margin)
            rows.append(
                {
                    "variant": variant.name,
                    "metric": metric,
                    "control": round(float(c.estimate_a), 4),
                    "value": round(float(c.estimate_b), 4),
                    "difference": round(float(c.difference), 4),
                    "low": round(float(c.low), 4),
                    "high": round(float(c.high), 4),
                    "p_value": round(float(c.p_value), 4),
                    "not_worse": bool(verdict.non_inferior),
                    "better": bool(verdict.superior),
                    "test": c.method,
                }
            )
    return rows


def leader_of(experiment: Experiment, paired: list[dict]) -> tuple[str, str]:
    """The treatment shown better on AUC and not worse by more than the margin on any metric (the
    largest AUC gain among several), else the control."""
    winners = [
        v.name
        for v in experiment.variants[1:]
        if all(r["not_worse"] for r in paired if r["variant"] == v.name)
        and any(r["better"] for r in paired if r["variant"] == v.name and r["metric"] == "auc")
    ]
    if not winners:
        return experiment.variants[0].name, "no treatment shown better on AUC and not worse elsewhere: the control"
    gain = {r["variant"]: r["difference"] for r in paired if r["metric"] == "auc"}
    best = max(winners, key=gain.get)
    return best, f"{best}: AUC {gain[best]:+.4f} against the control, its interval above 0; no metric worse"


experiments = load(EXPERIMENTS_FILE)
experiment_assets = [experiment_report(e) for e in experiments]
