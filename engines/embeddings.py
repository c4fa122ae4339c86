"""Item embeddings: a streaming Ray Data pipeline from catalogue rows to image and text embeddings,
the lake table that holds them, and the vector-store sync.

Pipeline stages (each its own Ray Data operator, streamed block by block):
  read        item rows -> thumbnail bytes                 (CPU tasks)
  preprocess  decode + resize + normalize, tokenize titles (CPU tasks)
  encode      CLIP image and text towers                   (actor pool; size, batch size, device from config)
  write       Parquet                                      (streaming writer)
A corrupt or missing image or an empty title does not fail the run: the item gets a row with no
embeddings and a `skip_reason`. Failed tasks are retried and a killed encoder actor is restarted;
the written rows are checked to be exactly one per input item.

Table `embeddings/items/date=D/part-0.parquet`: item_id, image_embedding, text_embedding
(list<float32>, null when skipped), model_version, skip_reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from engines.lake import Lake
from ml.clip import ClipSpec

EMBEDDINGS_ZONE = "embeddings"
ITEMS_TABLE = "items"
COLLECTION = "items"
PAYLOAD_INDEXES = {"category": "keyword", "creator": "integer", "price": "float", "flags": "keyword"}
OUTPUT_SCHEMA = {
    "item_id": pl.Int64, "image_embedding": pl.List(pl.Float32), "text_embedding": pl.List(pl.Float32),
    "model_version": pl.String, "skip_reason": pl.String,
}


@dataclass(frozen=True)
class FailureDrill:
    """For failure drills and tests: the first batch holding `item_id` in `stage` ('preprocess'
    raises, 'encode' kills its actor process) fails once; `marker` records that it happened."""
    item_id: int
    marker: str
    stage: str = "encode"


@dataclass(frozen=True)
class EmbedConfig:
    batch_size: int = 64            # rows per encoder call
    actors: int = 1                 # encoder actor pool size
    device: str = "cpu"             # "cuda" puts each encoder actor on a GPU
    torch_threads: int = 1          # per encoder actor
    read_block_rows: int = 256      # rows per streamed input block
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


def embed_items(items: pl.DataFrame, landing: Path, spec: ClipSpec, config: EmbedConfig,
                model_version: str) -> pl.DataFrame:
    """Run the pipeline over `items` (item_id, title, thumbnail_path relative to `landing`) and
    return one row per item (OUTPUT_SCHEMA). Ray must be started."""
    import ray

    if items.is_empty():
        return pl.DataFrame(schema=OUTPUT_SCHEMA)
    if items["item_id"].n_unique() != items.height:
        raise ValueError("embed_items: duplicate item_id in the input")
    source = items.select("item_id", "title", "thumbnail_path").to_arrow()
    blocks = [source.slice(start, config.read_block_rows)
              for start in range(0, source.num_rows, config.read_block_rows)]
    task_args = {"max_retries": config.task_retries, "retry_exceptions": True}
    encoder_args = {"num_gpus": 1} if config.device.startswith("cuda") else {}
    dataset = (
        ray.data.from_arrow(blocks)
        .map_batches(_read_thumbnails, fn_kwargs={"landing": str(landing)}, batch_format="pyarrow",
                     **task_args)
        .map_batches(_preprocess, fn_kwargs={"model_name": spec.model_name, "drill": config.drill},
                     batch_format="pyarrow", **task_args)
        .map_batches(_Encoder, fn_constructor_kwargs={"spec": spec, "config": config,
                                                      "model_version": model_version},
                     batch_size=config.batch_size, batch_format="numpy",
                     compute=ray.data.ActorPoolStrategy(size=config.actors), **encoder_args)
    )
    with tempfile.TemporaryDirectory(prefix="embeddings-") as folder:
        dataset.write_parquet(folder)
        written = pl.read_parquet(Path(folder) / "*.parquet") if any(Path(folder).glob("*.parquet")) \
            else pl.DataFrame(schema=OUTPUT_SCHEMA)
    written = written.cast(OUTPUT_SCHEMA).unique("item_id", keep="first").sort("item_id")
    expected = set(items["item_id"].to_list())
    got = set(written["item_id"].to_list())
    if got != expected:
        raise RuntimeError(f"embedding pipeline lost {len(expected - got)} and invented {len(got - expected)} items")
    return written


def _read_thumbnails(batch: pa.Table, landing: str) -> pa.Table:
    contents, errors = [], []
    for relative in batch.column("thumbnail_path").to_pylist():
        try:
            contents.append((Path(landing) / relative).read_bytes() if relative else None)
            errors.append(None if relative else "no thumbnail path")
        except OSError as error:
            contents.append(None)
            errors.append(f"thumbnail unreadable: {error.strerror or error}")
    return batch.append_column("image_bytes", pa.array(contents, pa.binary())) \
                .append_column("skip_reason", pa.array(errors, pa.string()))


def _preprocess(batch: pa.Table, model_name: str, drill: FailureDrill | None) -> pa.Table:
    from ml.clip import image_size_of_config, preprocess_image, tokenizer

    item_ids = batch.column("item_id").to_pylist()
    if drill and drill.stage == "preprocess":
        _fail_once(drill, item_ids)
    size = image_size_of_config(model_name)
    reasons = batch.column("skip_reason").to_pylist()
    titles = batch.column("title").to_pylist()
    pixels = np.zeros((len(item_ids), 3, size, size), np.float32)
    for row, data in enumerate(batch.column("image_bytes").to_pylist()):
        if reasons[row] is None and not (titles[row] or "").strip():
            reasons[row] = "empty title"
        if reasons[row] is not None:
            continue
        try:
            pixels[row] = preprocess_image(data, size)
        except Exception as error:  # PIL raises several types for corrupt files
            reasons[row] = f"corrupt image: {type(error).__name__}: {error}"
    tokens = tokenizer(ClipSpec(model_name))([t or "" for t in titles]).numpy()
    return pa.table({
        "item_id": batch.column("item_id"),
        "pixels": pa.FixedShapeTensorArray.from_numpy_ndarray(pixels),
        "tokens": pa.FixedShapeTensorArray.from_numpy_ndarray(tokens.astype(np.int64)),
        "skip_reason": pa.array(reasons, pa.string()),
    })


class _Encoder:
    """One encoder actor: the model loaded once, then batches of preprocessed rows."""

    def __init__(self, spec: ClipSpec, config: EmbedConfig, model_version: str):
        import torch

        from ml.clip import load_model

        torch.set_num_threads(config.torch_threads)
        self.device = config.device
        self.model = load_model(spec, device=config.device)
        self.model_version = model_version
        self.drill = config.drill

    def __call__(self, batch: dict) -> pa.Table:
        from ml.clip import encode_images, encode_texts

        item_ids = batch["item_id"]
        if self.drill and self.drill.stage == "encode":
            _fail_once(self.drill, item_ids.tolist(), kill=True)
        reasons = list(batch["skip_reason"])
        ok = np.array([r is None for r in reasons], bool)
        images = encode_images(self.model, batch["pixels"][ok], self.device) if ok.any() else None
        texts = encode_texts(self.model, batch["tokens"][ok], self.device) if ok.any() else None
        image_column, text_column, cursor = [], [], 0
        for good in ok:
            image_column.append(images[cursor].tolist() if good else None)
            text_column.append(texts[cursor].tolist() if good else None)
            cursor += int(good)
        return pa.table({
            "item_id": pa.array(item_ids, pa.int64()),
            "image_embedding": pa.array(image_column, pa.list_(pa.float32())),
            "text_embedding": pa.array(text_column, pa.list_(pa.float32())),
            "model_version": pa.array([self.model_version] * len(item_ids), pa.string()),
            "skip_reason": pa.array(reasons, pa.string()),
        })


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
        return pl.DataFrame(schema={**{k: v for k, v in OUTPUT_SCHEMA.items() if k != "skip_reason"},
                                    "date": pl.Date})
    frames = [lake.read_partition(EMBEDDINGS_ZONE, ITEMS_TABLE, d).with_columns(date=pl.lit(d))
              for d in days]
    return (pl.concat(frames).filter(pl.col("skip_reason").is_null()).drop("skip_reason")
            .sort("date").unique("item_id", keep="last").sort("item_id"))


def item_payloads(items: pl.DataFrame, flags: dict[int, list[str]] | None = None) -> list[dict]:
    """Vector-store payloads of catalogue rows: category, creator, price, flags."""
    flags = flags or {}
    return [{"item_id": row["item_id"], "category": row["category"], "creator": row["creator_id"],
             "price": float(row["price"]), "title": row["title"], "flags": flags.get(row["item_id"], [])}
            for row in items.select("item_id", "category", "creator_id", "price", "title").iter_rows(named=True)]


def sync_vector_store(store, embeddings: pl.DataFrame, catalogue: pl.DataFrame,
                      flags: dict[int, list[str]] | None = None) -> dict:
    """Upsert every embedded item of the catalogue into the `items` collection (image and text
    vectors, payload) and delete points of items no longer in the catalogue."""
    if embeddings.is_empty():
        return {"upserted": 0, "deleted": 0}
    dim = len(embeddings["image_embedding"][0])
    store.ensure_collection(COLLECTION, {"image": dim, "text": dim}, PAYLOAD_INDEXES)
    rows = embeddings.join(catalogue.select("item_id", "category", "creator_id", "price", "title"),
                           on="item_id", how="inner").sort("item_id")
    store.upsert(COLLECTION, [str(i) for i in rows["item_id"]],
                 {"image": np.stack(rows["image_embedding"].to_numpy()),
                  "text": np.stack(rows["text_embedding"].to_numpy())},
                 item_payloads(rows, flags))
    known = {str(i) for i in catalogue["item_id"]}
    removed = [i for i in store.ids(COLLECTION) if i not in known]
    store.delete(COLLECTION, removed)
    return {"upserted": rows.height, "deleted": len(removed)}


# --- the CLIP model the pipeline uses -------------------------------------------------------------
MODELS_ZONE = "models"


def model_manifest_path(lake: Lake) -> Path:
    return lake.root / MODELS_ZONE / "clip" / "current.json"


def save_model_manifest(lake: Lake, spec: ClipSpec, version: str, metrics: dict) -> Path:
    path = model_manifest_path(lake)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"model_name": spec.model_name, "checkpoint": spec.checkpoint,
                               "version": version, "metrics": metrics}, indent=2))
    os.replace(tmp, path)
    return path


def current_model(lake: Lake) -> tuple[ClipSpec, str]:
    """The CLIP model the clip_model asset chose, and its version."""
    path = model_manifest_path(lake)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: materialize the clip_model asset first")
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
