"""Item embeddings: a streaming Ray Data pipeline from catalogue rows to image and text embeddings,
the lake table that holds them, and the vector-store sync.

On CPUs the pipeline is one fused stage of Ray tasks, one per CPU of the cluster: each reads its
block's thumbnails, decodes and normalizes them, tokenizes the titles and runs both CLIP towers with
`torch_threads` threads. The model reaches the workers through Ray's object store and stays in each
worker process for the rest of the job (engines.models.ray_objects), so no actor has to start, import torch
and load it for every pipeline. On GPUs (`device="cuda"`) preprocessing stays in CPU tasks and
encoding moves to a pool of encoder actors, one GPU each. The embedded rows come back to the driver
through the object store (no worker writes a node-local file).

A corrupt or missing image or an empty title does not fail the run: the item gets a row with no
embeddings and a `skip_reason`. Failed tasks are retried and a killed worker or encoder actor is
replaced; the rows are checked to be exactly one per input item (none lost, none twice).

Table `embeddings/items/date=D/part-0.parquet`: item_id, image_embedding, text_embedding
(list<float32>, null when skipped), model_version, skip_reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from engines.data.lake import Lake
from engines.models.ray_objects import Shipped, block_rows, blocks_dataset, cached
from engines.retrieval.keywords import KEYWORD_VECTOR, average_length, document_vectors, item_documents
from ml.clip import ClipSpec

EMBEDDINGS_ZONE = "embeddings"
ITEMS_TABLE = "items"
COLLECTION = "items"
PAYLOAD_INDEXES = {
    "category": "keyword",
    "creator": "integer",
    "price": "float",
    "flags": "keyword",
    "model_version": "keyword",  # the CLIP version of the point's vectors: search filters on it
}
VERSION_FIELD = "model_version"
OUTPUT_SCHEMA = {
    "item_id": pl.Int64,
    "image_embedding": pl.List(pl.Float32),
    "text_embedding": pl.List(pl.Float32),
    "model_version": pl.String,
    "skip_reason": pl.String,
}


@dataclass(frozen=True)
class FailureDrill:
    """For failure drills and tests: the first batch holding `item_id` in `stage` ('preprocess'
    raises, 'encode' kills its worker process or encoder actor) fails once; `marker` records that
    it happened."""

    item_id: int
    marker: str
    stage: str = "encode"


@dataclass(frozen=True)
class EmbedConfig:
    batch_size: int = 64  # rows per encoder call
    actors: int = 0  # encoder actors; 0: encode in the CPU tasks (cuda: one actor per GPU)
    device: str = "cpu"  # "cuda" puts each encoder actor on a GPU
    torch_threads: int = 1  # per task or encoder actor (each holds one CPU)
    read_block_rows: int = 512  # rows per streamed block at most (fewer when that leaves a CPU idle)
    task_retries: int = 3
    drill: FailureDrill | None = field(default=None)


def catalogue_day(lake: Lake, day: date) -> pl.DataFrame:
    """The items new or changed on `day` (the warehouse partition), or an empty frame."""
    path = lake.partition_path("warehouse", "items", day)
    return pl.read_parquet(path) if path.exists() else pl.DataFrame()


def current_catalogue(lake: Lake, through: date | None = None) -> pl.DataFrame:
    """The newest row of every item in the warehouse up to `through` (all days when None)."""
    days = [d for d in lake.partition_days("warehouse", "items") if through is None or d <= through]
    if not days:
        return pl.DataFrame()
    frames = lake.scan_partitions("warehouse", "items", days)
    return frames.sort("updated_at").unique("item_id", keep="last").sort("item_id").collect()


def embed_items(
    items: pl.DataFrame, landing: Path, spec: ClipSpec, config: EmbedConfig, model_version: str
) -> pl.DataFrame:
    """Run the pipeline over `items` (item_id, title, thumbnail_path relative to `landing`, a folder
    every Ray node can read) and return one row per item (OUTPUT_SCHEMA). Ray must be started."""
    if items.is_empty():
        return pl.DataFrame(schema=OUTPUT_SCHEMA)
    if items["item_id"].n_unique() != items.height:
        raise ValueError("embed_items: duplicate item_id in the input")
    tables = list(embedding_batches(items, landing, spec, config, model_version))
    written = (
        pl.from_arrow(pa.concat_tables(tables)).cast(OUTPUT_SCHEMA) if tables else pl.DataFrame(schema=OUTPUT_SCHEMA)
    )
    expected = set(items["item_id"].to_list())
    got = set(written["item_id"].to_list())
    twice = written.height - written["item_id"].n_unique()
    if got != expected or twice:
        raise RuntimeError(
            f"embedding pipeline lost {len(expected - got)}, invented {len(got - expected)} "
            f"and duplicated {twice} items"
        )
    return written.sort("item_id")


def embedding_batches(items: pl.DataFrame, landing: Path, spec: ClipSpec, config: EmbedConfig, model_version: str):
    """The pipeline's output blocks as they arrive (pyarrow tables), unchecked."""
    from ray.data import ActorPoolStrategy

    from ml.clip import load_model

    source = items.select("item_id", "title", "thumbnail_path").to_arrow()
    rows = block_rows(source.num_rows, config.read_block_rows, at_least=min(config.batch_size, 64))
    model = Shipped.put(load_model(spec))  # one copy of the weights for every worker, on any node
    retries = {"max_retries": config.task_retries, "retry_exceptions": True}
    prepare = {"landing": str(landing), "model_name": spec.model_name, "drill": config.drill}
    dataset = blocks_dataset(source, rows)
    actors = _encoder_actors(config)
    if not actors:
        dataset = dataset.map_batches(
            _embed_block,
            fn_kwargs={**prepare, "model": model, "config": config, "model_version": model_version},
            batch_size=None,
            batch_format="pyarrow",
            num_cpus=1,
            **retries,
        )
    else:
        dataset = dataset.map_batches(
            _prepare_block, fn_kwargs=prepare, batch_size=None, batch_format="pyarrow", num_cpus=1, **retries
        ).map_batches(
            _Encoder,
            fn_constructor_kwargs={"model": model, "config": config, "model_version": model_version},
            batch_size=config.batch_size,
            batch_format="numpy",
            compute=ActorPoolStrategy(size=actors),
            num_cpus=1,
            num_gpus=1 if config.device.startswith("cuda") else 0,
        )
    yield from dataset.iter_batches(batch_format="pyarrow", batch_size=None)


def _encoder_actors(config: EmbedConfig) -> int:
    if config.actors or not config.device.startswith("cuda"):
        return config.actors
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    if not gpus:
        raise RuntimeError(f"device {config.device!r}: the Ray cluster has no GPU")
    return gpus


@dataclass
class _Prepared:
    item_ids: np.ndarray
    pixels: np.ndarray  # (n, 3, size, size) float32, zeros where skipped
    tokens: np.ndarray  # (n, context) int64
    reasons: list  # skip reason or None per row


def _prepare(batch: pa.Table, landing: str, model_name: str, drill: FailureDrill | None) -> _Prepared:
    """Read the thumbnails, decode and normalize them, tokenize the titles."""
    from ml.clip import image_size_of_config, preprocess_image, tokenizer

    item_ids = batch.column("item_id").to_numpy()
    if drill and drill.stage == "preprocess":
        _fail_once(drill, item_ids.tolist())
    size = image_size_of_config(model_name)
    titles = batch.column("title").to_pylist()
    pixels = np.zeros((len(item_ids), 3, size, size), np.float32)
    reasons = []
    for row, relative in enumerate(batch.column("thumbnail_path").to_pylist()):
        reason = None
        if not relative:
            reason = "no thumbnail path"
        elif not (titles[row] or "").strip():
            reason = "empty title"
        else:
            try:
                data = (Path(landing) / relative).read_bytes()
            except OSError as error:
                reason = f"thumbnail unreadable: {error.strerror or error}"
            else:
                try:
                    pixels[row] = preprocess_image(data, size)
                except Exception as error:  # PIL raises several types for corrupt files
                    reason = f"corrupt image: {type(error).__name__}: {error}"
        reasons.append(reason)
    tokens = tokenizer(ClipSpec(model_name))([t or "" for t in titles]).numpy().astype(np.int64)
    return _Prepared(item_ids, pixels, tokens, reasons)


def _embed_block(
    batch: pa.Table,
    landing: str,
    model_name: str,
    drill: FailureDrill | None,
    model: Shipped,
    config: EmbedConfig,
    model_version: str,
) -> pa.Table:
    """The fused CPU stage: prepare and encode one block in this worker process."""
    import torch

    torch.set_num_threads(config.torch_threads)
    prepared = _prepare(batch, landing, model_name, drill)
    return _encode(cached("clip", model, lambda m: m), prepared, config, model_version)


def _prepare_block(batch: pa.Table, landing: str, model_name: str, drill: FailureDrill | None) -> pa.Table:
    """The CPU stage in front of the encoder actors."""
    prepared = _prepare(batch, landing, model_name, drill)
    return pa.table(
        {
            "item_id": pa.array(prepared.item_ids, pa.int64()),
            "pixels": pa.FixedShapeTensorArray.from_numpy_ndarray(prepared.pixels),
            "tokens": pa.FixedShapeTensorArray.from_numpy_ndarray(prepared.tokens),
            "skip_reason": pa.array(prepared.reasons, pa.string()),
        }
    )


class _Encoder:
    """One encoder actor (GPU): the shipped model moved to the device once, then batches."""

    def __init__(self, model: Shipped, config: EmbedConfig, model_version: str):
        import ray
        import torch

        from ml.clip import import_open_clip

        import_open_clip()  # before the model's unpickling imports it
        torch.set_num_threads(config.torch_threads)
        self.model = ray.get(model.ref).to(config.device)
        self.config = config
        self.model_version = model_version

    def __call__(self, batch: dict) -> pa.Table:
        prepared = _Prepared(batch["item_id"], batch["pixels"], batch["tokens"], list(batch["skip_reason"]))
        return _encode(self.model, prepared, self.config, self.model_version)


def _encode(model, prepared: _Prepared, config: EmbedConfig, model_version: str) -> pa.Table:
    from ml.clip import encode_images, encode_texts

    if config.drill and config.drill.stage == "encode":
        _fail_once(config.drill, prepared.item_ids.tolist(), kill=True)
    ok = np.array([r is None for r in prepared.reasons], bool)
    rows = np.flatnonzero(ok)
    images, texts = [], []
    for start in range(0, len(rows), config.batch_size):
        chunk = rows[start : start + config.batch_size]
        images.append(encode_images(model, prepared.pixels[chunk], config.device))
        texts.append(encode_texts(model, prepared.tokens[chunk], config.device))
    n = len(prepared.item_ids)
    return pa.table(
        {
            "item_id": pa.array(prepared.item_ids, pa.int64()),
            "image_embedding": _vectors_column(images, ok),
            "text_embedding": _vectors_column(texts, ok),
            "model_version": pa.array([model_version] * n, pa.string()),
            "skip_reason": pa.array(prepared.reasons, pa.string()),
        }
    )


def _vectors_column(parts: list[np.ndarray], ok: np.ndarray) -> pa.Array:
    """list<float32> with one vector per ok row and null elsewhere, without a Python list per row."""
    values = np.concatenate(parts).astype(np.float32) if parts else np.zeros((0, 0), np.float32)
    dim = values.shape[1] if values.ndim == 2 else 0
    offsets = np.concatenate([[0], np.cumsum(ok.astype(np.int32) * dim)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1), pa.float32()), mask=pa.array(~ok))


def _fail_once(drill: FailureDrill, item_ids: list, kill: bool = False) -> None:
    if drill.item_id in item_ids and not os.path.exists(drill.marker):
        Path(drill.marker).write_text("failed once\n")
        if kill:
            os._exit(1)  # the worker dies mid-batch, as on an OOM kill or a lost node
        raise RuntimeError(f"failure drill: batch with item {drill.item_id}")


def write_item_embeddings(lake: Lake, day: date, frame: pl.DataFrame) -> Path:
    return lake.write_partition(EMBEDDINGS_ZONE, ITEMS_TABLE, day, frame)


def latest_item_embeddings(lake_root: str | Path) -> pl.DataFrame:
    """The newest embedded row of every item over all days (skipped rows ignored): item_id,
    image_embedding, text_embedding, model_version, date."""
    lake = Lake(Path(lake_root))
    days = lake.partition_days(EMBEDDINGS_ZONE, ITEMS_TABLE)
    if not days:
        return pl.DataFrame(schema={**{k: v for k, v in OUTPUT_SCHEMA.items() if k != "skip_reason"}, "date": pl.Date})
    frames = [lake.read_partition(EMBEDDINGS_ZONE, ITEMS_TABLE, d).with_columns(date=pl.lit(d)) for d in days]
    return (
        pl.concat(frames)
        .filter(pl.col("skip_reason").is_null())
        .drop("skip_reason")
        .sort("date")
        .unique("item_id", keep="last")
        .sort("item_id")
    )


def days_of_other_versions(lake: Lake, version: str) -> list[date]:
    """The embedded days holding a row of another CLIP version than `version` (to re-embed)."""
    days = []
    for day in lake.partition_days(EMBEDDINGS_ZONE, ITEMS_TABLE):
        path = lake.partition_path(EMBEDDINGS_ZONE, ITEMS_TABLE, day)
        versions = pl.read_parquet(path, columns=["model_version"])["model_version"].unique().to_list()
        if any(v != version for v in versions):
            days.append(day)
    return days


def item_payloads(items: pl.DataFrame, flags: dict[int, list[str]] | None = None) -> list[dict]:
    """Vector-store payloads of catalogue rows: category, creator, price, flags, and the CLIP version of
    the vectors (`model_version`) where the rows have one."""
    flags = flags or {}
    columns = ["item_id", "category", "creator_id", "price", "title"]
    versioned = VERSION_FIELD in items.columns
    return [
        {
            "item_id": row["item_id"],
            "category": row["category"],
            "creator": row["creator_id"],
            "price": float(row["price"]),
            "title": row["title"],
            "flags": flags.get(row["item_id"], []),
            **({VERSION_FIELD: row[VERSION_FIELD]} if versioned else {}),
        }
        for row in items.select(columns + ([VERSION_FIELD] if versioned else [])).iter_rows(named=True)
    ]


def sync_vector_store(
    store,
    embeddings: pl.DataFrame,
    catalogue: pl.DataFrame,
    flags: dict[int, list[str]] | None = None,
    collection: str = COLLECTION,
) -> dict:
    """Upsert every embedded item of the catalogue into the `items` collection (image and text
    vectors, the keyword vector of its title, description and category, payload with the embeddings'
    `model_version` when they have one) and delete points of
    items no longer in the catalogue. BM25's length normalization is relative to the whole catalogue's
    average document length."""
    if embeddings.is_empty():
        return {"upserted": 0, "deleted": 0}
    dim = len(embeddings["image_embedding"][0])
    store.ensure_collection(collection, {"image": dim, "text": dim}, PAYLOAD_INDEXES, sparse=[KEYWORD_VECTOR])
    wanted = ("item_id", "category", "creator_id", "price", "title", "description")
    columns = [c for c in wanted if c in catalogue.columns]
    rows = embeddings.join(catalogue.select(columns), on="item_id", how="inner").sort("item_id")
    store.upsert(
        collection,
        [str(i) for i in rows["item_id"]],
        {"image": np.stack(rows["image_embedding"].to_numpy()), "text": np.stack(rows["text_embedding"].to_numpy())},
        item_payloads(rows, flags),
        sparse={KEYWORD_VECTOR: document_vectors(item_documents(rows), average_length(item_documents(catalogue)))},
    )
    known = {str(i) for i in catalogue["item_id"]}
    removed = [i for i in store.ids(collection) if i not in known]
    store.delete(collection, removed)
    return {"upserted": rows.height, "deleted": len(removed)}


def needs_keyword_backfill(store) -> bool:
    """An `items` collection built before keyword vectors: every item must be upserted again."""
    return store.exists(COLLECTION) and KEYWORD_VECTOR not in store.sparse_vectors(COLLECTION)


def index_versions(store, collection: str = COLLECTION) -> dict[str | None, int]:
    """How many points of the collection carry each CLIP version (None: a point without one)."""
    if not store.exists(collection):
        return {}
    counts: dict[str | None, int] = {}
    for version in store.payload_field(collection, VERSION_FIELD).values():
        counts[version] = counts.get(version, 0) + 1
    return counts


def other_version_points(store, version: str, collection: str = COLLECTION) -> list[str]:
    """Ids of the points whose vectors are not of CLIP `version` (or carry no version)."""
    if not store.exists(collection):
        return []
    return [i for i, v in store.payload_field(collection, VERSION_FIELD).items() if v != version]


# --- the CLIP model the pipeline uses -------------------------------------------------------------
MODELS_ZONE = "models"


def model_manifest_path(lake: Lake) -> Path:
    return lake.root / MODELS_ZONE / "clip" / "current.json"


def save_model_manifest(lake: Lake, spec: ClipSpec, version: str, metrics: dict) -> Path:
    """Where the `models/clip` asset records the champion it downloaded from the registry (for readers
    without a registry client, such as the vision captioner)."""
    path = model_manifest_path(lake)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(
        json.dumps(
            {"model_name": spec.model_name, "checkpoint": spec.checkpoint, "version": version, "metrics": metrics},
            indent=2,
        )
    )
    os.replace(tmp, path)
    return path


def current_model(lake: Lake) -> tuple[ClipSpec, str]:
    """The champion CLIP as the `models/clip` asset last recorded it, and its version. Embeddings, the
    index and search read the registry's champion itself (engines.retrieval.clip_registry.champion)."""
    path = model_manifest_path(lake)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: materialize the models/clip asset first")
    manifest = json.loads(path.read_text())
    return ClipSpec(manifest["model_name"], manifest["checkpoint"]), manifest["version"]


def catalogue_images(landing: Path, items: pl.DataFrame, size: int) -> tuple[pl.DataFrame, np.ndarray]:
    """Preprocessed thumbnails of the items that have a readable one (training and evaluation)."""
    from ml.clip import preprocess_image

    keep, pixels = [], []
    for row, relative in enumerate(items["thumbnail_path"].to_list()):
        try:
            pixels.append(preprocess_image((landing / relative).read_bytes(), size))
            keep.append(row)
        except Exception:  # unreadable thumbnails are left out of training, as the pipeline skips them
            continue
    return items[keep], np.stack(pixels) if pixels else np.zeros((0, 3, size, size), np.float32)


def holdout_mask(item_ids: pl.Series, fraction: float) -> np.ndarray:
    """A deterministic held-out share of items (by id), so that evaluation never sees training items."""
    buckets = (item_ids.cast(pl.UInt64).hash(seed=7) % 1000).to_numpy()
    return buckets < int(fraction * 1000)
