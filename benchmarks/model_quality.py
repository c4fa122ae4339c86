"""Model quality: does the personalization model beat popularity, and how far is it from the limit?

Simulates DAYS days (and one more, whose interactions label the last day's late impressions and are
the "next day" below), runs the daily pipeline and the training data through Dagster, trains the
two-tower model on all days but the last (held out), runs batch inference for the last day exactly as
the `inference/personalization_recommendations` asset does (features as of the day's end through
engines.features.point_in_time, the vector database), and prints side by side:

- on the held-out day (impressions and their clicks/plays): AUC, recall@10, NDCG@10;
- on the next day's clicks, for the lists put online after the last day: hit rate@10 (share of users
  with a click the next day whose list holds one of their clicked items) and NDCG@10;

for the model, a popularity baseline (positives in the training rows; for the lists, the day's top-10
clicked items), the taste-cluster baseline (ml/taste_clusters.py: an EM mixture of user types over the
categories shown and clicked, fitted on the training rows; for the lists, on every row up to the last
day) and an oracle that ranks with the simulator's answer key (each user's taste cluster, each item's
hidden popularity and category: the click probability and exposure the simulator draws from), the best
any model could do on this data. Each figure is the mean and standard deviation over --seeds: one
simulated lake and one trained model per seed.

    .venv/bin/python benchmarks/model_quality.py              # 7 days at scale 0.25, seeds 11 12 13
    .venv/bin/python benchmarks/model_quality.py --days 4 --scale 0.1 --data-dir /tmp/quality-lakes
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

K = 10
SCORERS = ("model", "popularity", "taste_clusters", "oracle")


def lists_metrics(lists: dict[int, list[int]], clicks: dict[int, set[int]], k: int = K) -> dict[str, float]:
    """Hit rate@k and NDCG@k of users' lists against their clicks, over users with clicks and a list."""
    hits, ndcgs = [], []
    for user, clicked in clicks.items():
        if user not in lists:
            continue
        top = lists[user][:k]
        gains = [1.0 if i in clicked else 0.0 for i in top]
        hits.append(1.0 if any(gains) else 0.0)
        ideal = sum(1 / math.log2(r + 2) for r in range(min(len(clicked), k)))
        ndcgs.append(sum(g / math.log2(r + 2) for r, g in enumerate(gains)) / ideal)
    return {"users": len(hits), f"hit_rate@{k}": float(np.mean(hits)), f"ndcg@{k}": float(np.mean(ndcgs))}


def held_out_oracle(train_rows: pl.DataFrame, held_out: pl.DataFrame, key) -> dict:
    from ml.evaluation import auc, ranking_metrics
    from ml.personalization import LABEL, labelled

    rows = labelled(held_out)
    labels = rows.get_column(LABEL).to_numpy() > 0
    scores = np.array([key.click_logit(u, i) for u, i in rows.select("user_id", "item_id").iter_rows()])
    candidates = sorted(set(train_rows["item_id"].to_list()) | set(held_out["item_id"].to_list()))
    positives = rows.filter(pl.col(LABEL) > 0).group_by("user_id").agg(pl.col("item_id").unique())
    relevant = {u: set(i) for u, i in positives.iter_rows()}
    ranked = {u: sorted(candidates, key=lambda i: -key.expected_clicks(u, i))[:K] for u in relevant}
    return {"auc": auc(labels, scores), **ranking_metrics(ranked, relevant, K)}


def batch_lists(lake, day, model) -> tuple[dict[int, list[int]], pl.DataFrame]:
    """The lists batch inference puts online after `day` (the asset's engine path, one process), and the
    catalogue's items with their features as of the day's end."""
    from engines.models import batch_inference as engine
    from engines.retrieval.vector_store import VectorStore

    active = engine.active_users(lake, day)
    users = engine.entity_features(lake, day, model.spec.user.columns, "user_id", active).frame
    items = engine.entity_features(
        lake, day, model.spec.item.columns, "item_id", sorted(engine.existing_items(lake, day))
    ).frame
    with VectorStore.open(str(Path(tempfile.mkdtemp(prefix="quality-vectors-")))) as store:
        radius = engine.index_items(store, model, items, "quality")
        recommendations = engine.recommend(users, store, model, "quality", radius, K, engine="local")
    grouped = recommendations.sort("user_id", "rank").group_by("user_id", maintain_order=True).agg("item_id")
    return dict(grouped.iter_rows()), items


def taste_cluster_lists(rows: pl.DataFrame, items: pl.DataFrame, users: list[int]) -> dict[int, list[int]]:
    """The taste-cluster baseline's lists after the last day: fitted on every labelled row up to it,
    ranking the catalogue (categories as of the day's end)."""
    from ml import taste_clusters
    from ml.personalization import LABEL, labelled

    catalogue = dict(items.drop_nulls(taste_clusters.CATEGORY).select("item_id", taste_clusters.CATEGORY).iter_rows())
    mixture = taste_clusters.fit(labelled(rows), LABEL, catalogue)
    return mixture.rank(users, np.array(sorted(items.get_column("item_id").to_list())), K)


def lake_for(seed: int, args, root: Path) -> Path:
    """The seed's lake under `root`, simulated and run through the pipeline unless already there."""
    from benchmarks.lake import build_lake

    data_dir = root / f"seed-{seed}"
    if not (data_dir / "datasets" / "personalization_training").is_dir():
        print(f"seed {seed}: simulating {args.days} + 1 days at scale {args.scale}, running the pipeline ...")
        build_lake(data_dir, days=args.days, scale=args.scale, seed=seed)
    return data_dir


def measure(seed: int, data_dir: Path, args, scratch: Path) -> dict[str, dict[str, dict[str, float]]]:
    """One seed's figures: {"held_out": {scorer: metrics}, "lists": {scorer: metrics}}."""
    from benchmarks.lake import FIRST_DAY
    from engines.data.lake import Lake
    from engines.models.batch_inference import existing_items
    from ml.evaluation import evaluate, split_held_out
    from ml.personalization import TrainConfig, train
    from simulator import SimulatorConfig
    from simulator.answer_key import AnswerKey

    lake = Lake(data_dir)
    days = lake.partition_days("datasets", "personalization_training")
    frame = lake.scan_partitions("datasets", "personalization_training", days).collect()
    train_rows, held_out = split_held_out(frame)
    last = days[-1]
    config = TrainConfig(seed=seed, validation_share=args.validation_share, **dict(args.config or []))
    trained = train(train_rows, config, scratch / f"ray-{seed}")
    model = trained.model
    curve = " ".join(f"{s:.3f}" for s in trained.validation_scores)
    print(
        f"seed {seed}: trained {len(trained.loss_curve)} epochs on {train_rows.height - trained.validation_rows} "
        f"rows; validation score (mean of recall@10 and NDCG@10; epoch 0 = the untrained mixture start) {curve}; "
        f"kept epoch {trained.selected_epoch}",
        flush=True,
    )
    scores = evaluate(model, train_rows, held_out, K)
    key = AnswerKey.on(SimulatorConfig(seed=seed, start_date=FIRST_DAY).scaled(args.scale), last + timedelta(days=1))
    scores["oracle"] = held_out_oracle(train_rows, held_out, key)

    next_day = lake.read_partition("warehouse", "interactions", last + timedelta(days=1))
    clicked = next_day.filter(pl.col("event_type") == "click").group_by("user_id").agg(pl.col("item_id").unique())
    clicks = {u: set(i) for u, i in clicked.iter_rows()}
    model_lists, items = batch_lists(lake, last, model)
    today = lake.read_partition("warehouse", "interactions", last).filter(pl.col("event_type") == "click")
    popular = today.group_by("item_id").len().sort(["len", "item_id"], descending=[True, False])["item_id"][:K]
    catalogue = sorted(existing_items(lake, last))
    users = sorted(model_lists)
    lists = {
        "model": model_lists,
        "popularity": {u: popular.to_list() for u in users},
        "taste_clusters": taste_cluster_lists(frame, items, users),
        "oracle": {u: sorted(catalogue, key=lambda i: -key.expected_clicks(u, i))[:K] for u in users},
    }
    print(
        f"seed {seed}: held out {last} ({held_out.height} impressions), trained on {days[0]}..{days[-2]} "
        f"({train_rows.height} rows), lists against the clicks of {last + timedelta(days=1)}",
        flush=True,
    )
    return {"held_out": scores, "lists": {name: lists_metrics(per_user, clicks) for name, per_user in lists.items()}}


def spread(values: list[float], digits: int = 3) -> str:
    """Mean and standard deviation over the seeds."""
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1) if len(values) > 1 else 0.0:.{digits}f}"


def print_tables(results: list[dict]) -> None:
    tables = (
        ("held-out day: impressions and their clicks/plays", "held_out", ("auc", "recall@10", "ndcg@10")),
        ("lists put online after it: the next day's clicks", "lists", ("users", "hit_rate@10", "ndcg@10")),
    )
    for title, table, metrics in tables:
        print(f"\n{title} (mean ± sd over {len(results)} seeds)")
        print(f"{'scorer':<16}" + "".join(f"{m:>16}" for m in metrics))
        for name in SCORERS:
            cells = [spread([r[table][name][m] for r in results], 0 if m == "users" else 3) for m in metrics]
            print(f"{name:<16}" + "".join(f"{c:>16}" for c in cells))


def _setting(text: str) -> tuple[str, object]:
    """A `name=value` TrainConfig setting, the value typed as the field's default."""
    from ml.personalization import TrainConfig

    name, value = text.split("=", 1)
    kind = type(getattr(TrainConfig(), name))
    return name, (value.lower() in ("1", "true")) if kind is bool else kind(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13], help="one lake and model per seed")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="keep the lakes there, one per seed, and reuse them"
    )
    parser.add_argument(
        "--validation-share",
        type=float,
        default=0.2,
        help="share of the newest training day's clicking users held out to select the epoch (0: keep the last)",
    )
    parser.add_argument(
        "--config", type=_setting, nargs="*", help="TrainConfig fields as name=value (learning_rate=0.003 ...)"
    )
    args = parser.parse_args()

    import ray

    scratch = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    root = args.data_dir or scratch / "lakes"
    lakes = {seed: lake_for(seed, args, root) for seed in args.seeds}
    if not ray.is_initialized():  # the pipeline's Ray steps (geometry) may have started it in this process
        ray.init(
            num_cpus=2,
            object_store_memory=400 * 1024 * 1024,
            include_dashboard=False,
            _temp_dir=str(Path(tempfile.gettempdir()) / "bench-ray"),
            log_to_driver=False,
        )
    print_tables([measure(seed, data_dir, args, scratch) for seed, data_dir in lakes.items()])
    ray.shutdown()


if __name__ == "__main__":
    main()
