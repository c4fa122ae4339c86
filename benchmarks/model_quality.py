"""Model quality: does the personalization model beat popularity, and how far is it from the limit?

Simulates DAYS days (and one more, whose interactions label the last day's late impressions and are
the "next day" below), runs the daily pipeline and the training data through Dagster, trains the
two-tower model on all days but the last (held out), runs batch inference for the last day exactly as
the `inference/personalization_recommendations` asset does (features as of the day's end through
engines.point_in_time, the vector database), and prints side by side:

- on the held-out day (impressions and their clicks/plays): AUC, recall@10, NDCG@10;
- on the next day's clicks, for the lists put online after the last day: hit rate@10 (share of users
  with a click the next day whose list holds one of their clicked items) and NDCG@10;

for the model, a popularity baseline (positives in the training rows; for the lists, the day's top-10
clicked items) and an oracle that ranks with the simulator's answer key (each user's taste cluster,
each item's hidden popularity and category: the click probability and exposure the simulator draws
from), the best any model could do on this data.

    .venv/bin/python benchmarks/model_quality.py              # 7 days at scale 0.25
    .venv/bin/python benchmarks/model_quality.py --days 4 --scale 0.1
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


def batch_lists(lake, day, model) -> dict[int, list[int]]:
    """The lists batch inference puts online after `day` (the asset's engine path, one process)."""
    from engines import batch_inference as engine
    from engines.vector_store import VectorStore

    active = engine.active_users(lake, day)
    users = engine.entity_features(lake, day, model.spec.user.columns, "user_id", active).frame
    items = engine.entity_features(
        lake, day, model.spec.item.columns, "item_id", sorted(engine.existing_items(lake, day))
    ).frame
    with VectorStore.open(str(Path(tempfile.mkdtemp(prefix="quality-vectors-")))) as store:
        radius = engine.index_items(store, model, items, "quality")
        recommendations = engine.recommend(users, store, model, "quality", radius, K, engine="local")
    grouped = recommendations.sort("user_id", "rank").group_by("user_id", maintain_order=True).agg("item_id")
    return dict(grouped.iter_rows())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--data-dir", type=Path, default=None, help="reuse a lake built by an earlier run")
    args = parser.parse_args()

    import ray

    from benchmarks.lake import FIRST_DAY, build_lake
    from engines.lake import Lake
    from engines.simulator import SimulatorConfig
    from engines.simulator.answer_key import AnswerKey
    from ml.evaluation import evaluate, split_held_out
    from ml.personalization import TrainConfig, train

    scratch = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    data_dir = args.data_dir or scratch / "lake"
    if args.data_dir is None:
        print(f"simulating {args.days} + 1 days at scale {args.scale} and running the pipeline ...", flush=True)
        build_lake(data_dir, days=args.days, scale=args.scale, seed=args.seed)
    lake = Lake(data_dir)
    days = lake.partition_days("datasets", "personalization_training")
    frame = lake.scan_partitions("datasets", "personalization_training", days).collect()
    train_rows, held_out = split_held_out(frame)
    last = days[-1]

    if not ray.is_initialized():  # the pipeline's Ray steps (geometry) may have started it in this process
        ray.init(
            num_cpus=2,
            object_store_memory=400 * 1024 * 1024,
            include_dashboard=False,
            _temp_dir=str(Path(tempfile.gettempdir()) / "bench-ray"),
            log_to_driver=False,
        )
    model = train(train_rows, TrainConfig(), scratch / "ray").model
    scores = evaluate(model, train_rows, held_out, K)
    config = SimulatorConfig(seed=args.seed, start_date=FIRST_DAY).scaled(args.scale)
    key = AnswerKey.on(config, last + timedelta(days=1))
    scores["oracle"] = held_out_oracle(train_rows, held_out, key)

    next_day = lake.read_partition("warehouse", "interactions", last + timedelta(days=1))
    clicked = next_day.filter(pl.col("event_type") == "click").group_by("user_id").agg(pl.col("item_id").unique())
    clicks = {u: set(i) for u, i in clicked.iter_rows()}
    model_lists = batch_lists(lake, last, model)
    today = lake.read_partition("warehouse", "interactions", last).filter(pl.col("event_type") == "click")
    popular = today.group_by("item_id").len().sort(["len", "item_id"], descending=[True, False])["item_id"][:K]
    from engines.batch_inference import existing_items

    catalogue = sorted(existing_items(lake, last))
    lists = {
        "model": model_lists,
        "popularity": {u: popular.to_list() for u in model_lists},
        "oracle": {u: sorted(catalogue, key=lambda i: -key.expected_clicks(u, i))[:K] for u in model_lists},
    }
    print(
        f"\nheld-out day {last} ({held_out.height} impressions), trained on {days[0]}..{days[-2]} "
        f"({train_rows.height} rows)"
    )
    print(f"{'scorer':<12}{'AUC':>8}{'recall@10':>11}{'NDCG@10':>9}")
    for name in ("model", "popularity", "oracle"):
        s = scores[name]
        print(f"{name:<12}{s['auc']:>8.3f}{s['recall@10']:>11.3f}{s['ndcg@10']:>9.3f}")
    print(f"\nlists put online after {last}, against the clicks of {last + timedelta(days=1)}")
    print(f"{'lists':<12}{'users':>7}{'hit@10':>9}{'NDCG@10':>9}")
    for name, per_user in lists.items():
        m = lists_metrics(per_user, clicks)
        print(f"{name:<12}{m['users']:>7}{m['hit_rate@10']:>9.3f}{m['ndcg@10']:>9.3f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
