"""CLIP's lifecycle through the model registry: a trained CLIP is registered (MLflow model `clip`) with
its lineage and held-out metrics, and becomes the champion only when its held-out text-to-image
recall@10 is shown better than the champion's on the same items (paired bootstrap, ml.comparison);
otherwise it is the challenger. Embeddings, the vector index and search follow the champion: they load
it from the registry, never from a file the training step wrote, so a promotion or a rollback reaches
them (orchestration/sensors.py re-embeds when the champion changes).

A CLIP version is named by its weights (`ClipSpec.version`: config name plus a digest of the weights
file), so the same name is computed from a registered folder as from the file that was registered."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ml.clip import (
    ClipSpec,
    encode_images,
    encode_texts,
    image_size,
    load_model,
    preprocess_image,
    text_to_image_ranks,
    tokenizer,
)
from ml.comparison import Comparison, judge, paired_bootstrap

MODEL_NAME = "clip"
CHAMPION, CHALLENGER = "champion", "challenger"
VERSION_TAG = "mlplane.clip_version"
# the registered folder's layout, as serving/models/kinds/encoders.py reads it
WEIGHTS_FILE, CONFIG_FILE = "clip.pt", "clip.json"
GATE_K = 10  # the gate's metric: held-out text-to-image recall@10


def cache_folder(lake_root: Path) -> Path:
    """Where the lake keeps the registered versions it downloaded (one folder per registry version)."""
    return Path(lake_root) / "models" / "clip" / "registry"


def registered_folder(spec: ClipSpec, version: str, into: Path) -> Path:
    """The folder to register: the weights and the open_clip config name."""
    if not spec.checkpoint:
        raise ValueError("random weights cannot be registered: train CLIP or configure a checkpoint")
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spec.checkpoint, into / WEIGHTS_FILE)
    (into / CONFIG_FILE).write_text(json.dumps({"model_name": spec.model_name, "version": version}))
    return into


def register(registry, spec: ClipSpec, version: str, lineage: dict[str, str], metrics: dict[str, float]):
    """Register the weights as a new version of `clip`, or return the version that holds them already."""
    existing = by_clip_version(registry, version)
    if existing is not None:
        return existing
    with tempfile.TemporaryDirectory(prefix="clip-register-") as work:
        folder = registered_folder(spec, version, Path(work) / "clip")
        # MLflow's metric names allow no '@': recall@10 is logged as recall_at_10
        logged = {name.replace("@", "_at_"): value for name, value in metrics.items()}
        return registry.register(MODEL_NAME, folder, {**lineage, VERSION_TAG: version}, logged)


def by_clip_version(registry, version: str):
    return next((v for v in registry.versions(MODEL_NAME) if v.tags.get(VERSION_TAG) == version), None)


def download(registry, registry_version: str, cache: Path) -> tuple[ClipSpec, str]:
    """A registered version's weights, downloaded (and checksum-verified) under `cache`, and its CLIP version."""
    folder = registry.load(MODEL_NAME, registry_version, cache / f"v{registry_version}")
    config = json.loads((folder / CONFIG_FILE).read_text())
    spec = ClipSpec(config["model_name"], str(folder / WEIGHTS_FILE))
    return spec, spec.version


def champion(registry, cache: Path) -> tuple[ClipSpec, str, str]:
    """The champion CLIP: its spec (weights downloaded under `cache`), CLIP version and registry version."""
    current = registry.by_alias(MODEL_NAME, CHAMPION)
    if current is None:
        raise LookupError(
            f"the model registry has no {MODEL_NAME!r} champion: materialize clip_model (it registers CLIP)"
        )
    spec, version = download(registry, current.version, cache)
    return spec, version, current.version


def champion_version(registry, cache: Path) -> tuple[str, str]:
    """The champion's CLIP version and registry version, from its tag (downloading the weights only for a
    version registered without one)."""
    current = registry.by_alias(MODEL_NAME, CHAMPION)
    if current is None:
        raise LookupError(
            f"the model registry has no {MODEL_NAME!r} champion: materialize clip_model (it registers CLIP)"
        )
    tagged = current.tags.get(VERSION_TAG)
    return (tagged or download(registry, current.version, cache)[1]), current.version


@dataclass(frozen=True)
class HeldOut:
    """The held-out items the gate compares on: ids, thumbnails (preprocessed at one model's size; the files
    to read again for a model of another size) and titles."""

    item_ids: np.ndarray
    pixels: np.ndarray
    titles: list[str]
    thumbnails: list[Path]

    def pixels_at(self, size: int) -> np.ndarray:
        if self.pixels.shape[-1] == size:
            return self.pixels
        return np.stack([preprocess_image(path.read_bytes(), size) for path in self.thumbnails])

    def hits(self, model, spec: ClipSpec, k: int = GATE_K) -> np.ndarray:
        """1 where an item's title finds its own thumbnail among the k nearest held-out thumbnails."""
        images = encode_images(model, self.pixels_at(image_size(model)))
        texts = encode_texts(model, tokenizer(spec)(self.titles).numpy())
        return (text_to_image_ranks(images, texts) < k).astype(float)


@dataclass(frozen=True)
class GateVerdict:
    alias: str  # the alias the new version gets: champion or challenger
    reason: str
    comparison: Comparison | None  # None: no champion to beat

    def table(self) -> list[dict]:
        if self.comparison is None:
            return [{"verdict": self.alias, "reason": self.reason}]
        c = self.comparison
        return [
            {
                "metric": f"recall@{GATE_K}",
                "champion": round(c.estimate_a, 4),
                "candidate": round(c.estimate_b, 4),
                "difference": round(c.difference, 4),
                "low": round(c.low, 4),
                "high": round(c.high, 4),
                "verdict": self.alias,
            }
        ]


def gate(candidate_hits: np.ndarray, champion_hits: np.ndarray | None, item_ids: np.ndarray) -> GateVerdict:
    """Champion when there is none, or when recall@10 on the same held-out items is shown better (the
    paired bootstrap's interval of the difference above 0); a tie or a loss leaves it a challenger."""
    if champion_hits is None:
        return GateVerdict(CHAMPION, "no champion yet: nothing to beat", None)
    comparison = paired_bootstrap(champion_hits, candidate_hits, users=item_ids)
    judgement = judge(comparison, margin=0.0)
    alias = CHAMPION if judgement.superior else CHALLENGER
    return GateVerdict(alias, f"held-out recall@{GATE_K}: {judgement.reason}", comparison)


def champion_hits(registry, held_out: HeldOut, cache: Path) -> tuple[np.ndarray | None, str | None]:
    """The champion's per-item hits on `held_out` and its CLIP version (None, None without a champion)."""
    if registry.by_alias(MODEL_NAME, CHAMPION) is None:
        return None, None
    spec, version, _ = champion(registry, cache)
    return held_out.hits(load_model(spec), spec), version


def held_out_set(items, pixels: np.ndarray, mask, landing: Path) -> HeldOut:
    """The gate's held-out items out of the catalogue's `items` (item_id, title, thumbnail_path) and their
    preprocessed `pixels`, where `mask` is true."""
    kept = items.filter(mask)
    return HeldOut(
        kept["item_id"].to_numpy(),
        pixels[mask],
        kept["title"].to_list(),
        [landing / p for p in kept["thumbnail_path"].to_list()],
    )


def gate_against_champion(registry, model, spec: ClipSpec, held_out: HeldOut) -> tuple[GateVerdict, str | None]:
    """The verdict on `model` against the registry's champion on the same held-out items, and the champion's
    CLIP version before it (None without one)."""
    with tempfile.TemporaryDirectory(prefix="clip-champion-") as work:
        hits, version = champion_hits(registry, held_out, Path(work))
    if version == spec.version:
        return GateVerdict(CHAMPION, "this version is the champion already", None), version
    return gate(held_out.hits(model, spec), hits, held_out.item_ids), version


def assign_alias(registry, registry_version: str, verdict: GateVerdict, who: str) -> None:
    """Point the verdict's alias at `registry_version`, unless it points there already."""
    held = registry.by_alias(MODEL_NAME, verdict.alias)
    if held is None or held.version != registry_version:
        registry.set_alias(MODEL_NAME, verdict.alias, registry_version, who=who, reason=verdict.reason)
