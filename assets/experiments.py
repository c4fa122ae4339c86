"""Offline comparison reports of the A/B experiments in deploy/experiments.yaml: one asset per experiment."""

import tempfile
from pathlib import Path

from dagster import AssetKey, Failure, MaterializeResult, MetadataValue, asset

from assets.datasets import DATASETS_ZONE, TRAINING_SET
from assets.datasets import KEY as TRAINING_SET_KEY
from assets.metadata import table
from assets.models import READS_ITEM_EMBEDDINGS, clip_image_vectors, with_embeddings_as_of
from assets.partitions import daily_partitions, partition_days
from engines.experiments import Experiment, load
from feature_defs.compile.polars import day_end
from ml import evaluation
from ml import personalization as model_code
from resources.lake import LakeResource
from resources.registry import ModelRegistryResource

# The experiments are declared in the repository like the feature catalogue: one report asset each.
# (The model server can follow another file at run time: `mlplane serve models --experiments`.)
EXPERIMENTS_FILE = Path(__file__).resolve().parents[1] / "deploy" / "experiments.yaml"
RANK_K = 10


def experiment_report(experiment: Experiment):
    variants = ", ".join(f"{v.name} ({v.model_ref}, {v.traffic:.0%})" for v in experiment.variants)

    @asset(
        key=AssetKey(["experiments", experiment.name]),
        group_name="experiments",
        description=f"Offline comparison for A/B experiment {experiment.name!r} on {experiment.model!r}: "
        f"{variants}. Each variant's model scores the held-out day's impressions of the users "
        f"the experiment assigns to it. {experiment.description}",
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
        # rows and their item embeddings as of each row's time (engines.point_in_time), as in training
        history = with_embeddings_as_of(
            the_lake, the_lake.scan_partitions(DATASETS_ZONE, TRAINING_SET, days[:-1]).collect()
        )
        held_out = with_embeddings_as_of(the_lake, the_lake.read_partition(DATASETS_ZONE, TRAINING_SET, day))
        assigned = held_out.get_column("user_id").map_elements(  # null: a user outside its slice of the layer
            lambda u: variant.name if (variant := experiment.assign(u)) else None, return_dtype=str
        )
        registry = model_registry.get_client()
        embeddings = clip_image_vectors(the_lake, day_end(days[-2]))
        rows = []
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
                subset = held_out.filter(assigned == variant.name)
                scores = evaluation.evaluate(
                    model, history, subset, RANK_K, embeddings if model.spec.item.embedding_column else None
                )["model"]
                rows.append(
                    {
                        "variant": variant.name,
                        "model": variant.model_ref,
                        "version": version.version,
                        "traffic": variant.traffic,
                        "users": subset.get_column("user_id").n_unique(),
                        "impressions": subset.height,
                        **{k: round(v, 4) for k, v in scores.items()},
                    }
                )
        best = max(rows, key=lambda r: r["auc"])
        return MaterializeResult(
            metadata={
                "comparison": table(rows),
                "leader_by_auc": best["variant"],
                "salt": experiment.salt,
                "config": MetadataValue.path(str(EXPERIMENTS_FILE)),
            }
        )

    return report


experiments = load(EXPERIMENTS_FILE)
experiment_assets = [experiment_report(e) for e in experiments]
