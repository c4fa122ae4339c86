"""Embedding throughput and vector search, side by side with their naive baselines, same run.

1. Images/s of the Ray Data pipeline (engines/retrieval/embeddings.py: fused read + preprocess + encode tasks,
   one per Ray CPU, or preprocessing tasks and an encoder actor pool with --actors / on GPUs)
   against a plain single-process PyTorch loop (read, preprocess, encode in batches, torch threads =
   the pipeline's CPUs) on the same model and the same thumbnails, with the ratio; for the compact
   model and for ViT-B-32 with random weights (few images: it is slow on a CPU).
2. Vector search at --vectors points: the embedded engine the project uses (Qdrant Edge, HNSW)
   against exact brute force (numpy), P50/P99 latency and recall@10; plus qdrant-client's local
   mode (the alternative considered) at --local-mode-vectors points.

  .venv/bin/python benchmarks/embeddings.py [--device cpu|cuda] [--images 1000] [--vit-images 48]
                                            [--vectors 100000] [--repeat 3] [--ray-cpus 2] [--actors 0]

--device cuda runs the encoders on a GPU (Ray gets the machine's GPUs; one per encoder actor).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.retrieval.embeddings import EmbedConfig, embed_items  # noqa: E402
from engines.retrieval.vector_store import VectorStore, _ServerEngine  # noqa: E402
from ml.clip import (  # noqa: E402
    ClipSpec,
    encode_images,
    encode_texts,
    image_size,
    load_model,
    preprocess_image,
    tokenizer,
)
from resources.ray import RayResource  # noqa: E402


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def catalogue(folder: Path, n: int) -> pl.DataFrame:
    from simulator import SimulatorConfig, simulate

    scale = max(0.1, n / SimulatorConfig().n_items)
    simulate(folder, 1, seed=5, scale=scale)
    items = pl.read_parquet(folder / "landing" / "items" / "*" / "*.parquet")
    return items.unique("item_id").sort("item_id").head(n)


def plain_loop(items: pl.DataFrame, landing: Path, spec: ClipSpec, batch_size: int, device: str) -> float:
    """Single process, no Ray: read, preprocess, tokenize and encode in batches; returns seconds."""
    started = time.perf_counter()
    model = load_model(spec, device=device)
    size, tokenize = image_size(model), tokenizer(spec)
    for start in range(0, items.height, batch_size):
        batch = items.slice(start, batch_size)
        pixels = np.stack([preprocess_image((landing / p).read_bytes(), size) for p in batch["thumbnail_path"]])
        encode_images(model, pixels, device)
        encode_texts(model, tokenize(batch["title"].to_list()).numpy(), device)
    return time.perf_counter() - started


def throughput(name: str, spec: ClipSpec, items: pl.DataFrame, landing: Path, args) -> None:
    """Both sides alternate in one process, so that other load on the machine hits both; the first
    run of each (imports, worker start, model load) is reported apart from the median of the rest."""
    import torch

    config = EmbedConfig(
        batch_size=args.batch_size, actors=args.actors, device=args.device, torch_threads=args.torch_threads
    )
    # the same CPU budget on both sides: the pipeline's tasks (one per Ray CPU) or its actor pool
    torch.set_num_threads(args.torch_threads * (args.actors or args.ray_cpus))
    ray_s, plain_s = [], []
    for _ in range(args.repeat + 1):
        started = time.perf_counter()
        out = embed_items(items, landing, spec, config, "benchmark")
        ray_s.append(time.perf_counter() - started)
        assert out.height == items.height
        plain_s.append(plain_loop(items, landing, spec, args.batch_size, args.device))
    n = items.height
    (ray_cold, *ray_s), (plain_cold, *plain_s) = ray_s, plain_s
    ray_rate, plain_rate = n / statistics.median(ray_s), n / statistics.median(plain_s)
    print(
        f"{name:<22} {n:>6} {ray_rate:>10.1f} {n / percentile(ray_s, 0.99):>8.1f} {n / ray_cold:>8.1f} "
        f"{plain_rate:>10.1f} {n / percentile(plain_s, 0.99):>8.1f} {n / plain_cold:>8.1f} "
        f"{ray_rate / plain_rate:>7.2f}",
        flush=True,
    )


def vector_search(args) -> None:
    rng = np.random.default_rng(0)
    n, dim = args.vectors, args.dim
    # clustered, like embeddings of a catalogue (uniform random vectors have no neighbours to find)
    centres = rng.normal(size=(max(1, n // 100), dim))
    data = (centres[rng.integers(0, len(centres), n)] + 0.5 * rng.normal(size=(n, dim))).astype(np.float32)
    queries = (
        centres[rng.integers(0, len(centres), args.queries)] + 0.5 * rng.normal(size=(args.queries, dim))
    ).astype(np.float32)
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)

    def exact(q: np.ndarray, count: int) -> list[str]:
        scores = unit[:count] @ (q / np.linalg.norm(q))
        top = np.argpartition(-scores, 10)[:10]
        return [str(i) for i in top[np.argsort(-scores[top])]]

    print(f"\nvector search, {dim}-d cosine, top 10, {args.queries} queries (clustered vectors)")
    print(f"{'engine':<34} {'vectors':>8} {'load s':>8} {'index s':>8} {'P50 ms':>8} {'P99 ms':>8} {'recall@10':>10}")
    for engine, count in (("Qdrant Edge (embedded, HNSW)", n), ("qdrant-client local mode", args.local_mode_vectors)):
        if count <= 0:
            continue
        truth = [set(exact(q, count)) for q in queries]
        with tempfile.TemporaryDirectory() as folder:
            store = (
                VectorStore.open(folder)
                if engine.startswith("Qdrant Edge")
                else VectorStore(_ServerEngine(path=folder), folder)
            )
            store.ensure_collection("bench", {"v": dim})
            started = time.perf_counter()
            store.upsert("bench", [str(i) for i in range(count)], {"v": data[:count]}, [{}] * count)
            load = time.perf_counter() - started
            started = time.perf_counter()
            store.search("bench", queries[0], "v", 10)  # the first search flushes and builds the index
            index = time.perf_counter() - started
            if engine.startswith("Qdrant Edge"):
                indexed = store._engine._shard("bench").info().indexed_vectors_count
                print(f"  (Qdrant Edge: {indexed} of {count} vectors in HNSW-indexed segments)", flush=True)
            latencies, recalls = [], []
            for q, expected in zip(queries, truth):
                started = time.perf_counter()
                hits = store.search("bench", q, "v", 10)
                latencies.append(time.perf_counter() - started)
                recalls.append(len(expected & {h.id for h in hits}) / 10)
            store.close()
        print(
            f"{engine:<34} {count:>8} {load:>8.1f} {index:>8.1f} {statistics.median(latencies) * 1000:>8.2f} "
            f"{percentile(latencies, 0.99) * 1000:>8.2f} {np.mean(recalls):>10.3f}",
            flush=True,
        )
    latencies = []
    for q in queries:
        started = time.perf_counter()
        exact(q, n)
        latencies.append(time.perf_counter() - started)
    print(
        f"{'exact brute force (numpy)':<34} {n:>8} {'':>8} {'':>8} {statistics.median(latencies) * 1000:>8.2f} "
        f"{percentile(latencies, 0.99) * 1000:>8.2f} {1.0:>10.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--images", type=int, default=1000, help="thumbnails for the compact model")
    parser.add_argument("--vit-images", type=int, default=48, help="thumbnails for ViT-B-32 (0 skips it)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--actors", type=int, default=0, help="encoder actors (0: encode in the CPU tasks; cuda: 0 means one per GPU)"
    )
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument(
        "--local-mode-vectors",
        type=int,
        default=20_000,
        help="qdrant-client local mode is slow to load: fewer points (0 skips it)",
    )
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA GPU on this machine")

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other work skews the figures)")
    with tempfile.TemporaryDirectory(prefix="bench-embeddings-") as folder:
        root = Path(folder)
        print(f"simulating {args.images} catalogue items ...", flush=True)
        items = catalogue(root, args.images)
        # the weights travel through the object store: room for ViT-B-32 (about 600 MB)
        ray = RayResource(
            num_cpus=args.ray_cpus,
            num_gpus=None if args.device == "cuda" else 0,
            object_store_mb=1024,
            temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"),
        )
        with ray.session():
            encoders = f"{args.actors} encoder actor(s)" if args.actors else "encoding in the CPU tasks"
            print(
                f"\nimages/s (image + title encoded), device {args.device}, batch {args.batch_size}, "
                f"{args.ray_cpus} Ray CPUs, {encoders}, {args.torch_threads} torch thread(s) each; "
                f"median and P99 of {args.repeat} warm runs, and the first (cold) run"
            )
            print(
                f"{'model':<22} {'images':>6} {'Ray med':>10} {'P99':>8} {'cold':>8} {'plain med':>10} "
                f"{'P99':>8} {'cold':>8} {'ratio':>7}"
            )
            throughput("compact (random init)", ClipSpec(), items, root / "landing", args)
            if args.vit_images:
                throughput(
                    "ViT-B-32 (random init)", ClipSpec("ViT-B-32"), items.head(args.vit_images), root / "landing", args
                )
    vector_search(args)


if __name__ == "__main__":
    main()
