"""Search quality: hybrid search (CLIP vectors and BM25 keywords fused by reciprocal rank) against the
CLIP vectors alone, on the same index, the same model and the same queries, in one run.

Simulates a catalogue, trains the compact CLIP model on it as the `clip_model` asset does (items held
out by `holdout_mask`, Ray Train's local mode), embeds every item, indexes them with
`engines.retrieval.embeddings.sync_vector_store` (dense and keyword vectors) in an embedded Qdrant, then asks
`engines.retrieval.search.ItemSearch` with and without `dense_only`:

- exact title: each of --sample random items searched by its own title; the share found at rank 1
  (of all of them and of those whose title no other item has), and the share whose rank-1 item has
  that very title (items sharing a title cannot be told apart by it);
- held-out text-to-image recall@10: each item CLIP never trained on searched by its title, and by a
  paraphrase from the simulator's vocabulary (noun and adjective swapped for their synonyms, the
  answer key the product never reads); the share found in the top 10 of the whole catalogue.

    .venv/bin/python benchmarks/search_quality.py                     # the demo's catalogue: 4 days, 3 epochs
    .venv/bin/python benchmarks/search_quality.py --days 2 --scale 0.25 --epochs 12
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

K = 10


def build_index(root: Path, args) -> tuple[pl.DataFrame, np.ndarray, object]:
    """The simulated catalogue, its held-out mask and the trained model's spec; the index in root/vectors."""
    from engines.retrieval.embeddings import catalogue_images, holdout_mask, sync_vector_store
    from engines.retrieval.vector_store import VectorStore
    from ml.clip import (
        COMPACT_MODEL,
        ClipSpec,
        TrainConfig,
        encode_images,
        encode_texts,
        image_size,
        load_model,
        tokenizer,
        train_clip,
    )
    from resources.ray import RayResource
    from simulator import simulate

    simulate(root, args.days, seed=args.seed, scale=args.scale)
    items = pl.read_parquet(root / "landing" / "items" / "*" / "*.parquet")
    catalogue = items.sort("updated_at").unique("item_id", keep="last").sort("item_id")
    spec = ClipSpec(COMPACT_MODEL)
    items, pixels = catalogue_images(root / "landing", catalogue, image_size(load_model(spec)))
    held_out = holdout_mask(items["item_id"], 0.2)
    RayResource(num_cpus=args.ray_cpus, object_store_mb=300).ensure_started()
    started = time.perf_counter()
    output = root / "clip.pt"
    config = TrainConfig(epochs=args.epochs, num_workers=0, cpus_per_worker=args.ray_cpus)
    train_clip(spec, pixels[~held_out], items.filter(~held_out)["title"].to_list(), config, output)
    spec = ClipSpec(COMPACT_MODEL, str(output))
    model = load_model(spec)
    embeddings = pl.DataFrame(
        {
            "item_id": items["item_id"],
            "image_embedding": encode_images(model, pixels).tolist(),
            "text_embedding": encode_texts(model, tokenizer(spec)(items["title"].to_list()).numpy()).tolist(),
        },
        schema_overrides={"image_embedding": pl.List(pl.Float32), "text_embedding": pl.List(pl.Float32)},
    )
    with VectorStore.open(str(root / "vectors")) as store:
        sync_vector_store(store, embeddings, catalogue)
    print(f"{items.height} items indexed; CLIP trained {args.epochs} epochs in {time.perf_counter() - started:.0f} s")
    return items, held_out, spec


def ranks(search, queries: list[str], targets: list[int], dense_only: bool) -> list[int | None]:
    """Each target's 1-based rank in its query's top K (None: not there)."""
    out = []
    for query, target in zip(queries, targets):
        found = [h.payload["item_id"] for h in search.search(text=query, k=K, dense_only=dense_only)]
        out.append(found.index(target) + 1 if target in found else None)
    return out


def share(values: list, at_most: int = 1) -> float:
    """Share of ranks at most `at_most` (booleans: share true)."""
    return float(np.mean([v is True or (v is not None and v is not False and v <= at_most) for v in values]))


def title_metrics(search, sample: pl.DataFrame, unique: set[str], dense_only: bool) -> list[float]:
    """Own item at rank 1 (all sampled items, those whose title no other item has), and an item of
    that very title at rank 1 (items sharing a title cannot be told apart by it)."""
    titles, targets = sample["title"].to_list(), sample["item_id"].to_list()
    tops = [search.search(text=t, k=1, dense_only=dense_only) for t in titles]
    own = [bool(top) and top[0].payload["item_id"] == i for top, i in zip(tops, targets)]
    same_title = [bool(top) and top[0].payload["title"] == t for top, t in zip(tops, titles)]
    return [share(own), share([o for o, t in zip(own, titles) if t in unique]), share(same_title)]


def report(search, items: pl.DataFrame, held_out: np.ndarray, args) -> None:
    from simulator.vocabulary import paraphrase

    sample = items[sorted(random.Random(args.seed).sample(range(items.height), min(args.sample, items.height)))]
    counts = items.group_by("title").len()
    unique = set(counts.filter(pl.col("len") == 1)["title"].to_list())
    evaluation = items.filter(held_out)
    print(
        f"{sample.height} random items searched by their title ({sum(t not in unique for t in sample['title'])} "
        f"share it with another item); {evaluation.height} held-out items"
    )
    print(f"{'metric':<52} {'dense only':>11} {'hybrid':>8}")
    names = (
        "exact title: own item at rank 1",
        "exact title: own item at rank 1, unique titles",
        "exact title: an item of that title at rank 1",
    )
    dense, hybrid = (title_metrics(search, sample, unique, d) for d in (True, False))
    for name, d, h in zip(names, dense, hybrid):
        print(f"{name:<52} {d:>11.3f} {h:>8.3f}", flush=True)
    targets = evaluation["item_id"].to_list()
    for name, queries in (
        ("held-out text-to-image recall@10, title", evaluation["title"].to_list()),
        ("held-out text-to-image recall@10, paraphrase", [paraphrase(t) for t in evaluation["title"].to_list()]),
    ):
        d, h = (share(ranks(search, queries, targets, dense_only), K) for dense_only in (True, False))
        print(f"{name:<52} {d:>11.3f} {h:>8.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=4, help="days simulated (the demo: 4)")
    parser.add_argument("--scale", type=float, default=1.0, help="catalogue size against the default")
    parser.add_argument("--epochs", type=int, default=3, help="CLIP training epochs (the demo: 3)")
    parser.add_argument("--sample", type=int, default=200, help="random items searched by their title")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--ray-cpus", type=int, default=2)
    args = parser.parse_args()

    from engines.retrieval.search import ItemSearch
    from engines.retrieval.vector_store import VectorStore

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-search-") as folder:
        root = Path(folder)
        items, held_out, spec = build_index(root, args)
        with VectorStore.open(str(root / "vectors")) as store:
            report(ItemSearch(store, spec), items, held_out, args)


if __name__ == "__main__":
    main()
