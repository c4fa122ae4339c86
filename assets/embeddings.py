"""CLIP embeddings of the catalogue: the model, the daily item embeddings (Ray Data), the vector
index (Qdrant) and content-violation (copy) flags. Thin: the work is in ml/clip.py and engines/."""

import time

import polars as pl
from dagster import AssetKey, BackfillPolicy, Config, Failure, MaterializeResult, MetadataValue, asset
from pydantic import Field

from assets.metadata import table
from assets.partitions import daily_partitions, partition_days
from assets.pipelines import code_version
from engines.retrieval import clip_registry
from engines.retrieval.embeddings import (
    COLLECTION,
    EmbedConfig,
    catalogue_day,
    catalogue_images,
    current_catalogue,
    embed_items,
    holdout_mask,
    index_versions,
    latest_item_embeddings,
    needs_keyword_backfill,
    other_version_points,
    sync_vector_store,
    write_item_embeddings,
)
from engines.safety import content_violation as cv
from engines.safety.copy_calibration import Calibration, calibrate
from engines.safety.copy_match import CANDIDATES, MATCH_SCHEMA, match_originals, read_thumbnails
from engines.safety.copy_model import copy_features
from engines.safety.copy_registry import register_calibration
from ml.clip import (
    COMPACT_MODEL,
    ClipSpec,
    TrainConfig,
    encode_images,
    encode_texts,
    image_size,
    load_model,
    retrieval_recall,
    tokenizer,
    train_clip,
)
from resources.lake import LakeResource
from resources.ray import RayResource
from resources.registry import ModelRegistryResource
from resources.vector_store import VectorStoreResource

CLIP_MODEL = AssetKey("clip_model")
CLIP_CHAMPION = AssetKey(["models", "clip"])  # assets/serving.py: the registry's champion CLIP
ITEM_EMBEDDINGS = AssetKey(["embeddings", "items"])
VIOLATION_FLAGS = AssetKey(["content_violations", "flags"])
ITEM_VECTORS = AssetKey(["vectors", "items"])
WAREHOUSE_ITEMS = AssetKey(["warehouse", "items"])
# the newest content_violation release as the flags find it (an observable source asset, assets/ground_truth.py):
# the flags read the release that the queue they feed leads to, a loop Dagster's acyclic graph shows this way
PUBLISHED_VIOLATION_RELEASE = AssetKey(["ground_truth", cv.TASK, "published_release"])


class ClipModelConfig(Config):
    model_name: str = Field(default=COMPACT_MODEL, description="open_clip model config")
    checkpoint: str | None = Field(
        default=None,
        description="Local weights file (production: ViT-B-32 or larger); None trains the compact model here",
    )
    epochs: int = 30
    batch_size: int = 64
    learning_rate: float = 2e-3
    num_workers: int = Field(
        default=1, ge=0, description="Ray Train workers; 0: in the run's own process (Ray Train's local mode)"
    )
    cpus_per_worker: int | None = Field(
        default=None,
        description="CPUs each worker reserves and runs torch threads on; None: its even share of the in-process "
        "Ray (RayResource.cpus_per_worker). Fewer leave room for runs alongside",
    )
    placement_strategy: str = Field(
        default="PACK", description="Ray Train workers over the nodes: PACK, SPREAD or STRICT_SPREAD (one per node)"
    )
    use_gpu: bool | None = Field(default=None, description="GPU workers; None: when the Ray cluster has GPUs")
    holdout_fraction: float = Field(default=0.2, description="Items kept out of training for evaluation")


@asset(
    key=CLIP_MODEL,
    group_name="embeddings",
    description="The CLIP model for item embeddings: the compact open_clip config trained here on the "
    "catalogue's thumbnails and titles with ClipLoss as a Ray Train job, or weights from a "
    "configured checkpoint; registered in MLflow as `clip` with its lineage and held-out metrics. It becomes "
    "the champion only when its held-out text-to-image recall@10 is shown better than the champion's on "
    "the same items (paired bootstrap); otherwise it is the challenger. Metadata: recall@1/5/10 vs random, "
    "the gate.",
    deps=[WAREHOUSE_ITEMS],
    kinds={"pytorch", "ray", "mlflow"},
    owners=["team:ml-platform"],
    tags={"domain": "models"},
)
def clip_model(
    context, config: ClipModelConfig, lake: LakeResource, ray: RayResource, model_registry: ModelRegistryResource
) -> MaterializeResult:
    store = lake.get_client()
    catalogue = current_catalogue(store)
    if catalogue.is_empty():
        raise ValueError("no items in warehouse/items: ingest the catalogue before training CLIP")
    spec = ClipSpec(config.model_name, config.checkpoint)
    size = image_size(load_model(ClipSpec(config.model_name)))
    items, pixels = catalogue_images(store.root / "landing", catalogue, size)
    held_out = holdout_mask(items["item_id"], config.holdout_fraction)
    history = []
    if config.checkpoint is None:
        spec, history = train(context, config, store, ray, spec, items.filter(~held_out), pixels[~held_out])
    if not spec.checkpoint:
        raise Failure("clip_model chose no weights file (random weights cannot be registered): train or configure one")
    model = load_model(spec)
    evaluation = clip_registry.held_out_set(items, pixels, held_out, store.root / "landing")
    metrics = retrieval_recall(
        encode_images(model, evaluation.pixels),
        encode_texts(model, tokenizer(spec)(evaluation.titles).numpy()),
    )
    registry = model_registry.get_client()
    verdict, champion_version = clip_registry.gate_against_champion(registry, model, spec, evaluation)
    lineage = clip_lineage(context, store, held_out)
    registered = clip_registry.register(registry, spec, spec.version, lineage, metrics)
    clip_registry.assign_alias(registry, registered.version, verdict, who=f"dagster run {context.run.run_id}")
    context.log.info(f"{spec.version} (registry v{registered.version}) is the {verdict.alias}: {verdict.reason}")
    return MaterializeResult(
        metadata={
            "model_version": spec.version,
            "registry_version": MetadataValue.int(int(registered.version)),
            "alias": verdict.alias,
            "gate": table(verdict.table()),
            "gate_reason": verdict.reason,
            "champion_before": champion_version or "none",
            "checkpoint": spec.checkpoint,
            "parameters": sum(p.numel() for p in model.parameters()),
            **clip_training_metadata(held_out, history, metrics),
            **{k: v for k, v in lineage.items() if k != "mlplane.dagster_run_id"},
            "loss_by_epoch": loss_by_epoch(history),
        }
    )


def clip_lineage(context, store, held_out) -> dict[str, str]:
    """The registry tags that say which code, data and run made a CLIP version."""
    return {
        "mlplane.code_version": code_version(),
        "mlplane.data_partitions": ",".join(d.isoformat() for d in store.partition_days("warehouse", "items")),
        "mlplane.dagster_run_id": context.run.run_id,
        "mlplane.dagster_asset": CLIP_MODEL.to_user_string(),
        "mlplane.train_items": str(int((~held_out).sum())),
        "mlplane.held_out_items": str(int(held_out.sum())),
    }


def clip_training_metadata(held_out, history: list[dict], metrics: dict[str, float]) -> dict:
    """clip_model's metadata on its training items and held-out recall."""
    return {
        "train_items": int((~held_out).sum()),
        "train_worker_nodes": len(set(history[-1].get("worker_nodes", []))) if history else 0,
        "held_out_items": int(held_out.sum()),
        "text_to_image_recall": table(
            [
                {
                    "k": k,
                    "recall": round(metrics[f"recall@{k}"], 4),
                    "random": round(metrics[f"random_recall@{k}"], 4),
                }
                for k in (1, 5, 10)
            ]
        ),
        **{k: float(v) for k, v in metrics.items()},
    }


def loss_by_epoch(history: list[dict]):
    """The training loss per epoch as a markdown table, or a line saying the weights were not trained here."""
    if not history:
        return "pretrained checkpoint, not trained here"
    rows = "\n".join(f"| {h['epoch']} | {h['loss']:.4f} |" for h in history)
    return MetadataValue.md("| epoch | loss |\n|---|---|\n" + rows)


def train(context, config: ClipModelConfig, store, ray: RayResource, spec: ClipSpec, items, pixels):
    """Train the configured model on the training items (Ray Train); the spec of the weights written."""
    ray.ensure_started()
    use_gpu = ray.cluster_gpus() > 0 if config.use_gpu is None else config.use_gpu
    # the run's own output: readers load the registered copy of a version (engines.retrieval.clip_registry)
    output = store.root / "models" / "clip" / f"{config.model_name}.pt"
    workers = f"{config.num_workers} Ray Train worker(s)" if config.num_workers else "Ray Train in this process"
    context.log.info(f"training {config.model_name} on {items.height} items, {workers}, gpu={use_gpu}")
    history = train_clip(
        spec,
        pixels,
        items["title"].to_list(),
        TrainConfig(
            epochs=config.epochs,
            batch_size=config.batch_size,
            learning_rate=config.learning_rate,
            num_workers=config.num_workers,
            use_gpu=use_gpu,
            cpus_per_worker=config.cpus_per_worker or ray.cpus_per_worker(config.num_workers),
            placement_strategy=config.placement_strategy,
        ),
        output,
        storage=store.root / "models" / "clip" / "ray_train",
    )
    return ClipSpec(config.model_name, str(output)), history


class ItemEmbeddingsConfig(Config):
    batch_size: int = Field(default=64, description="Rows per encoder call")
    actors: int = Field(
        default=0,
        description="Encoder actors; 0 encodes in the CPU tasks that read and preprocess (on cuda: one actor per GPU)",
    )
    device: str = Field(default="cpu", description="'cpu' or 'cuda' (one GPU per encoder actor)")
    torch_threads: int = 1


@asset(
    key=ITEM_EMBEDDINGS,
    group_name="embeddings",
    description="CLIP image and text embeddings of the items new or changed each day (warehouse/items) by the "
    "registry's champion CLIP (each row carries its version), by a streaming Ray Data pipeline: read, "
    "preprocess and encode in one task per CPU (GPUs: an encoder actor pool), rows back through the object "
    "store, written as Parquet. Items "
    "with a corrupt image or empty title get a row with a skip_reason.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[CLIP_CHAMPION, WAREHOUSE_ITEMS],
    kinds={"ray", "pytorch", "parquet"},
    owners=["team:ml-platform"],
    tags={"domain": "embeddings"},
)
def item_embeddings(
    context, config: ItemEmbeddingsConfig, lake: LakeResource, ray: RayResource, model_registry: ModelRegistryResource
):
    store = lake.get_client()
    spec, version, registry_version = clip_registry.champion(
        model_registry.get_client(), clip_registry.cache_folder(store.root)
    )
    ray.ensure_started()
    embed_config = EmbedConfig(
        batch_size=config.batch_size, actors=config.actors, device=config.device, torch_threads=config.torch_threads
    )
    days, skipped, total, started = [], [], 0, time.perf_counter()
    for day in partition_days(context):
        items = catalogue_day(store, day)
        frame = (
            embed_items(items, store.root / "landing", spec, embed_config, version)
            if items.height
            else pl.DataFrame(schema={"item_id": pl.Int64})
        )
        if items.height:
            write_item_embeddings(store, day, frame)
        bad = frame.filter(pl.col("skip_reason").is_not_null()) if items.height else frame
        skipped += [
            {"day": day.isoformat(), "item_id": r["item_id"], "reason": r["skip_reason"]}
            for r in bad.iter_rows(named=True)
        ]
        days.append(
            {
                "day": day.isoformat(),
                "items": items.height,
                "embedded": items.height - bad.height,
                "skipped": bad.height,
            }
        )
        total += items.height
        context.log.info(f"embeddings {day}: {items.height} items, {bad.height} skipped")
    seconds = time.perf_counter() - started
    return MaterializeResult(
        metadata={
            "model_version": version,
            "registry_version": registry_version,
            "items": total,
            "skipped": len(skipped),
            "items_per_second": round(total / seconds, 1) if seconds else 0.0,
            "days": table(days),
            "skipped_items": table(skipped[:200]),
        }
    )


class ViolationConfig(Config):
    threshold: float | None = Field(
        default=None,
        description="A fixed cut on the verified similarity to an earlier item of another creator instead of "
        "the copy model; None: the model and threshold calibrated on the newest ground-truth release "
        "(before one, nothing is flagged)",
    )
    candidates: int = Field(
        default=CANDIDATES,
        ge=1,
        description="Nearest earlier items of other creators (by CLIP image embedding) "
        "verified on pixels for each item",
    )


def copy_pool(store) -> pl.DataFrame:
    """Every embedded catalogue item with what copy matching needs: item_id, image_embedding, creator_id,
    created_at, thumbnail_path."""
    latest = latest_item_embeddings(store.root)
    if latest.is_empty():
        return pl.DataFrame()
    if "skip_reason" in latest.columns:
        latest = latest.filter(pl.col("skip_reason").is_null())
    catalogue = current_catalogue(store).select("item_id", "creator_id", "created_at", "thumbnail_path")
    return latest.select("item_id", "image_embedding").join(catalogue, on="item_id", how="inner")


@asset(
    key=VIOLATION_FLAGS,
    group_name="embeddings",
    description="Copy detection: each item's nearest earlier items of other creators by CLIP image embedding, "
    "verified on pixels; the flag carries the matched original's id, similarity and copy score (a logistic "
    "model over the match's features: similarity, margin, own-creator match, time order), flagged at or "
    "above the threshold; model and threshold calibrated out-of-fold on the newest ground-truth release. "
    "Before the first release nothing is flagged. Metadata: precision and recall from held-out folds "
    "with 95% intervals (also in content_violations/calibration.json). Each new calibration is a version of "
    "`copy_detector` in the model registry, tagged mlplane.ground_truth_releases with the release that fed "
    "it; the model server's content_violation model flags with the newest version.",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[ITEM_EMBEDDINGS, WAREHOUSE_ITEMS, PUBLISHED_VIOLATION_RELEASE],
    kinds={"numpy", "parquet"},
    owners=["team:trust-and-safety"],
    tags={"domain": "embeddings"},
)
def content_violation_flags(
    context, config: ViolationConfig, lake: LakeResource, model_registry: ModelRegistryResource
):
    store = lake.get_client()
    days = partition_days(context)
    embedded = {day: day_embeddings(store, day) for day in days}
    truth = cv.release_truth(store.root)
    pool = copy_pool(store)
    wanted = set(truth.labels["item_id"].to_list()) if truth else set()
    for frame in embedded.values():
        wanted |= set(frame["item_id"].to_list())
    pixels = read_thumbnails(store.root / "landing", pool) if pool.height else {}
    matches = (
        match_originals(pool.filter(pl.col("item_id").is_in(sorted(wanted))), pool, pixels, config.candidates)
        if pool.height
        else pl.DataFrame(schema=MATCH_SCHEMA)
    )
    calibration = release_calibration(matches, truth) if truth else None
    registered = None
    if calibration is not None and truth is not None:
        calibration.save(store.root)  # the online scorer uses the same model and threshold
        registered = register_copy_detector(context, model_registry, calibration, truth, embedded)
    threshold = config.threshold if config.threshold is not None else calibration.threshold if calibration else None
    source = (
        "config: a fixed similarity cut"
        if config.threshold is not None
        else f"calibrated on release {truth.release.name}"
        if calibration is not None and truth is not None  # a calibration comes from a release
        else "none: nothing flagged until a ground-truth release with both classes"
    )
    frames = []
    for day, frame in embedded.items():
        flags = cv.flag_items(frame, matches, calibration, config.threshold)
        store.write_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, day, flags)
        frames.append(flags)
    flags = pl.concat(frames) if frames else pl.DataFrame(schema=cv.FLAGS_SCHEMA)
    scores = cross_validated(calibration) if calibration else {}
    context.log.info(f"content violations: threshold {threshold} ({source}), against the release: {scores}")
    return MaterializeResult(
        metadata={
            **({"threshold": float(threshold)} if threshold is not None else {}),
            **(
                {"copy_model": table([{"feature": f, "weight": round(w, 4)} for f, w in calibration.model.weighted()])}
                if calibration is not None
                else {}
            ),
            "threshold_source": source,
            "release": truth.release.name
            if truth
            else "none yet: nothing flagged until the first ground-truth release",
            "candidates": config.candidates,
            **({"registry_version": MetadataValue.int(int(registered.version))} if registered is not None else {}),
            "clip_versions": ", ".join(sorted({v for f in embedded.values() for v in f["model_version"].to_list()}))
            or "none",
            "flagged": flags.filter("flagged").height,
            **{k: v for k, v in scores.items() if v is not None},
            "flagged_items": table(
                [
                    {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                    for r in flags.filter("flagged").head(100).iter_rows(named=True)
                ]
            ),
        }
    )


def release_calibration(matches: pl.DataFrame, truth: cv.ReleaseTruth) -> Calibration | None:
    """The copy model, its threshold and their cross-validated accuracy on the release's labelled items."""
    labelled = truth.labels.join(matches, on="item_id", how="left")
    features, matched = copy_features(labelled)
    return calibrate(
        features,
        matched,
        labelled["is_violation"].to_numpy(),
        labelled["audit"].to_numpy(),
        truth.release.name,
    )


def register_copy_detector(
    context, model_registry: ModelRegistryResource, calibration: Calibration, truth: cv.ReleaseTruth, embedded
):
    """The calibration's registry version (engines.safety.copy_registry), with this run's lineage."""
    lineage = {
        "mlplane.code_version": code_version(),
        "mlplane.dagster_run_id": context.run.run_id,
        "mlplane.dagster_asset": VIOLATION_FLAGS.to_user_string(),
        "mlplane.clip_versions": ",".join(sorted({v for f in embedded.values() for v in f["model_version"].to_list()})),
    }
    registered, new = register_calibration(model_registry.get_client(), calibration, truth.release, lineage)
    state = "new" if new else "unchanged"
    context.log.info(f"copy_detector v{registered.version} ({state}) from {truth.release.lineage}")
    return registered


def cross_validated(calibration: Calibration) -> dict:
    """Metadata: held-out estimates with their 95% intervals."""
    out = {"labelled_items": calibration.labelled_items, "folds": calibration.folds}
    for name in ("precision", "recall", "false_positive_rate", "prevalence"):
        value = getattr(calibration, name)
        out |= {f"cv_{name}": value.value, f"cv_{name}_low": value.low, f"cv_{name}_high": value.high}
    return out


def day_embeddings(store, day) -> pl.DataFrame:
    """The day's embedded items (item_id, model_version), the skipped ones left out."""
    path = store.partition_path("embeddings", "items", day)
    if not path.exists():
        return pl.DataFrame(schema={"item_id": pl.Int64, "model_version": pl.String})
    return pl.read_parquet(path).filter(pl.col("skip_reason").is_null()).select("item_id", "model_version")


@asset(
    key=ITEM_VECTORS,
    group_name="embeddings",
    description="The Qdrant collection `items`: image and text vectors of every embedded item, a BM25 keyword "
    "sparse vector (title, description, category) for hybrid search, payload "
    "(category, creator, price, flags, model_version: the CLIP version of the vectors) and payload indexes; "
    "idempotent upserts of each day's embeddings, items gone from the catalogue deleted. Only vectors of the "
    "registry's champion CLIP are indexed: an index holding another version is repaired (the champion's "
    "vectors upserted for every item, the others' points deleted until they are re-embedded).",
    partitions_def=daily_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    deps=[ITEM_EMBEDDINGS, VIOLATION_FLAGS, WAREHOUSE_ITEMS, CLIP_CHAMPION],
    kinds={"qdrant"},
    owners=["team:ml-platform"],
    tags={"domain": "embeddings"},
)
def item_vectors(context, lake: LakeResource, vector_store: VectorStoreResource, model_registry: ModelRegistryResource):
    store = lake.get_client()
    version, registry_version = clip_registry.champion_version(
        model_registry.get_client(), clip_registry.cache_folder(store.root)
    )
    catalogue = current_catalogue(store)
    flags = {}  # an item's newest verdict wins
    for day in store.partition_days(cv.FLAGS_ZONE, cv.FLAGS_TABLE):
        for row in store.read_partition(cv.FLAGS_ZONE, cv.FLAGS_TABLE, day).iter_rows(named=True):
            flags[row["item_id"]] = ["suspected_violation"] if row["flagged"] else []
    # the newest embedding of each item embedded on these days, so that re-running an old day neither
    # brings back old vectors nor drops items added since
    touched = [
        store.read_partition("embeddings", "items", d)["item_id"]
        for d in partition_days(context)
        if store.partition_path("embeddings", "items", d).exists()
    ]
    latest = latest_item_embeddings(store.root)
    with vector_store.get_client() as vectors:
        # an index from before keyword vectors, or holding another CLIP version: every item again
        repair = needs_keyword_backfill(vectors) or bool(other_version_points(vectors, version))
        if repair or not touched:
            wanted = latest if repair else latest.clear()
        else:
            wanted = latest.filter(pl.col("item_id").is_in(pl.concat(touched).implode()))
        current = wanted.filter(pl.col("model_version") == version)
        result = sync_vector_store(vectors, current, catalogue, flags)
        other = other_version_points(vectors, version)
        vectors.delete(COLLECTION, other)
        versions = index_versions(vectors)
        if set(versions) - {version}:
            raise Failure(f"vectors/items still mixes CLIP versions {versions} after repair; search would mix them")
        count = sum(versions.values())
    context.log.info(f"vectors/items: {result}, {count} points of {version}")
    return MaterializeResult(
        metadata={
            **result,
            "points": count,
            "model_version": version,
            "registry_version": registry_version,
            "repaired": repair,
            "deleted_other_versions": len(other),
            "awaiting_reembedding": wanted.height - current.height,
            "location": vector_store.location,
        }
    )


embedding_assets = [clip_model, item_embeddings, content_violation_flags, item_vectors]
