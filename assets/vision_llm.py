"""`vision_captioner`: a vision-language model built from the platform's own models (ml/vision_llm.py):
the current CLIP's image tower and `gateway_llm`, joined by a projector and trained to caption the
catalogue's thumbnails with their titles. Saved in Hugging Face's LLaVA format and registered in MLflow
as `vision_captioner`; its caption quality on held-out items sits beside a text-only baseline."""

import io
from functools import partial
from pathlib import Path

import numpy as np
from dagster import AssetCheckResult, AssetCheckSpec, AssetKey, Config, MaterializeResult, MetadataValue, asset

from assets.embeddings import CLIP_MODEL, WAREHOUSE_ITEMS
from assets.llm import GATEWAY_LLM, gateway_llm_dir, json_metrics, register_version, train_into
from assets.metadata import table
from engines.retrieval.embeddings import current_catalogue, current_model, holdout_mask
from ml.clip import load_model, model_config
from ml.vision_llm import CaptionData, CaptionerConfig, train_and_evaluate
from resources.lake import LakeResource
from resources.registry import ModelRegistryResource

VISION_CAPTIONER = AssetKey(["models", "vision_captioner"])
REGISTERED_NAME = "vision_captioner"


class VisionCaptionerConfig(Config):
    steps: int = 300
    holdout_fraction: float = 0.2
    promote: bool = True  # move the registry alias `champion` to the new version when its check passes


def vision_captioner_dir(lake_root: str | Path) -> Path:
    return Path(lake_root) / "models" / "vision_captioner"


def catalogue_thumbnails(landing: Path, catalogue) -> tuple[list[int], list[np.ndarray]]:
    """(rows, RGB images) of the catalogue items with a title and a thumbnail that decodes."""
    from PIL import Image

    rows, images = [], []
    for row, (relative, title) in enumerate(zip(catalogue["thumbnail_path"].to_list(), catalogue["title"].to_list())):
        if not (title or "").strip():  # nothing to learn a caption from
            continue
        try:
            with Image.open(io.BytesIO((landing / relative).read_bytes())) as image:
                images.append(np.asarray(image.convert("RGB")))
            rows.append(row)
        except Exception:  # unreadable thumbnails are left out, as CLIP's training leaves them out
            continue
    return rows, images


@asset(
    key=VISION_CAPTIONER,
    group_name="models",
    description="A LLaVA-format vision-language model from the platform's own parts: the current CLIP's "
    "image tower, gateway_llm, and a projector trained with the Llama to caption catalogue thumbnails "
    "with their titles; registered in MLflow as `vision_captioner`.",
    deps=[CLIP_MODEL, GATEWAY_LLM, WAREHOUSE_ITEMS],
    kinds={"pytorch", "huggingface", "mlflow"},
    owners=["team:ml-platform"],
    tags={"domain": "llm"},
    check_specs=[
        AssetCheckSpec(
            "beats_text_only_baseline",
            asset=VISION_CAPTIONER,
            description="On held-out items its captions match more title words than the best caption "
            "that ignores the image (the most common word at each position)",
        )
    ],
)
def vision_captioner(context, config: VisionCaptionerConfig, lake: LakeResource, model_registry: ModelRegistryResource):
    store = lake.get_client()
    catalogue = current_catalogue(store)
    rows, images = catalogue_thumbnails(store.root / "landing", catalogue)
    items = catalogue[rows]
    held_out = holdout_mask(items["item_id"], config.holdout_fraction)
    titles = items["title"].to_list()
    train_rows, test_rows = np.flatnonzero(~held_out), np.flatnonzero(held_out)
    clip_spec, clip_version = current_model(store)
    llm_dir = gateway_llm_dir(lake.root)
    language_model = json_metrics(llm_dir)["tokenizer_sha256"]
    vision_cfg = model_config(clip_spec.model_name)["vision_cfg"]

    data = CaptionData(images, titles, train_rows, test_rows)
    train = partial(
        train_and_evaluate,
        clip_model=load_model(clip_spec),
        vision_cfg=vision_cfg,
        llm_dir=llm_dir,
        data=data,
        config=CaptionerConfig(steps=config.steps),
        provenance={"clip_version": clip_version, "gateway_llm_tokenizer": language_model},
        log=context.log.info,
    )
    target = vision_captioner_dir(lake.root)
    metrics = train_into(target, train)
    passed = metrics["word_accuracy"] > metrics["baseline_word_accuracy"]
    registered = {k: v for k, v in metrics.items() if k not in ("samples", "baseline_caption")}
    version = register_version(
        context,
        model_registry,
        REGISTERED_NAME,
        target,
        registered,
        {"warehouse/items": store.partition_days("warehouse", "items")},
        promote=config.promote and passed,
        role="vision",
        passed_because="its captions beat the text-only baseline",
    )
    yield MaterializeResult(
        metadata={
            "path": str(target),
            "clip_version": clip_version,
            "held_out_items": metrics["held_out_items"],
            "word_accuracy": metrics["word_accuracy"],
            "baseline_word_accuracy": metrics["baseline_word_accuracy"],
            "baseline_caption": metrics["baseline_caption"],
            "registered_version": MetadataValue.int(int(version.version)),
            "held_out_captions": table(metrics["samples"]),
        }
    )
    yield AssetCheckResult(
        check_name="beats_text_only_baseline",
        passed=passed,
        metadata={"word_accuracy": metrics["word_accuracy"], "baseline": metrics["baseline_word_accuracy"]},
    )
