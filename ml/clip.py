"""CLIP for the marketplace catalogue: open_clip models, image/text preprocessing, contrastive
training as a Ray Train job and text-to-image retrieval metrics.

The embedded default is `mlplane-clip-compact` (model_configs/, 7.4M parameters, 64px images,
128-d embeddings), trained here on the simulated catalogue's thumbnails and titles with
open_clip's ClipLoss. In production the same code loads any open_clip config (ViT-B-32 or larger)
with weights from a local checkpoint file: nothing is downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ml.ray_train import EpochCheckpoints, fitted, node_id

COMPACT_MODEL = "mlplane-clip-compact"
MODEL_CONFIGS = Path(__file__).parent / "model_configs"
RECALL_KS = (1, 5, 10)
WEIGHTS_FILE = "model.pt"  # in a training checkpoint: the network's weights
TRAINING_FILE = "training.pt"  # in a training checkpoint: optimizer, schedule, history, random state


def import_open_clip():
    """open_clip, imported without Hugging Face transformers unless something imported it already:
    open_clip's model module imports it (3 s of a process's start, with its dependency checks) for Hugging
    Face text towers only, which the compact config has not; `load_model` brings it back for one that has.
    Ray workers call this before they unpickle a model."""
    import sys

    if "open_clip" not in sys.modules and "transformers" not in sys.modules:
        sys.modules["transformers"] = None  # an ImportError for open_clip's optional import
        try:
            import open_clip
        finally:
            if sys.modules.get("transformers") is None:
                del sys.modules["transformers"]
    import open_clip

    return open_clip


def enable_hf_text_towers(open_clip) -> None:
    """open_clip's Hugging Face text towers, after `import_open_clip` left them without transformers."""
    import importlib

    if open_clip.hf_model.transformers is None:
        importlib.reload(open_clip.hf_model)  # its classes see transformers now: they share its globals


def register_model_configs() -> None:
    """Make the project's model configs known to open_clip (idempotent)."""
    open_clip = import_open_clip()
    if COMPACT_MODEL not in open_clip.list_models():
        open_clip.add_model_config(MODEL_CONFIGS)


def model_config(model_name: str) -> dict:
    """open_clip's config of `model_name` (the project's own included, in a process that has loaded none)."""
    register_model_configs()
    config = import_open_clip().get_model_config(model_name)
    if config is None:
        raise ValueError(f"open_clip knows no model config {model_name!r}")
    return config


@dataclass(frozen=True)
class ClipSpec:
    """Which model: an open_clip config name and, optionally, a local checkpoint with its weights."""

    model_name: str = COMPACT_MODEL
    checkpoint: str | None = None

    @property
    def version(self) -> str:
        """Config name plus a digest of the weights (`random` without a checkpoint)."""
        if not self.checkpoint:
            return f"{self.model_name}@random"
        digest = hashlib.sha256()
        with open(self.checkpoint, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return f"{self.model_name}@{digest.hexdigest()[:12]}"


def load_model(spec: ClipSpec, device: str = "cpu"):
    """The model in eval mode on `device`; a missing checkpoint file is an error naming it."""
    open_clip = import_open_clip()
    register_model_configs()
    if spec.model_name not in open_clip.list_models():
        raise ValueError(f"unknown open_clip model config {spec.model_name!r}")
    if open_clip.get_model_config(spec.model_name).get("text_cfg", {}).get("hf_model_name"):
        enable_hf_text_towers(open_clip)
    if spec.checkpoint and not Path(spec.checkpoint).is_file():
        raise FileNotFoundError(f"CLIP checkpoint {spec.checkpoint} does not exist")
    model = open_clip.create_model(spec.model_name, pretrained=spec.checkpoint or None, device=device)
    return model.eval()


def image_size(model) -> int:
    size = model.visual.image_size
    return int(size[0] if isinstance(size, tuple | list) else size)


def image_size_of_config(model_name: str) -> int:
    return int(model_config(model_name)["vision_cfg"]["image_size"])


@functools.lru_cache(maxsize=4)
def tokenizer(spec: ClipSpec):
    open_clip = import_open_clip()
    register_model_configs()
    return open_clip.get_tokenizer(spec.model_name)


class ImageTooLarge(ValueError):
    """An image whose header declares more pixels than the caller allows (nothing was decoded)."""


def open_image(data: bytes, max_pixels: int | None = None):
    """A PIL image over the bytes, its header read but nothing decoded (PIL decodes lazily), so a small
    file declaring a huge canvas is refused before its pixels take memory or time."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as error:  # PIL's own ceiling, checked at open
        raise ImageTooLarge(f"more pixels than {max_pixels or Image.MAX_IMAGE_PIXELS} ({error})") from error
    width, height = image.size
    if max_pixels is not None and width * height > max_pixels:
        image.close()
        raise ImageTooLarge(f"{width}x{height} pixels, more than {max_pixels}")
    return image


def preprocess_image(data: bytes, size: int, max_pixels: int | None = None) -> np.ndarray:
    """PNG/JPEG bytes -> normalized float32 CHW array at the model's size. Raises on a corrupt image,
    and ImageTooLarge, before decoding, on one over `max_pixels`."""
    import_open_clip()
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
    from PIL import Image

    with open_image(data, max_pixels) as image:
        image = image.convert("RGB")
        if image.size != (size, size):
            image = image.resize((size, size), Image.Resampling.BICUBIC)
        pixels = np.asarray(image, dtype=np.float32) / 255.0
    pixels = (pixels - np.asarray(OPENAI_DATASET_MEAN, np.float32)) / np.asarray(OPENAI_DATASET_STD, np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def encode_images(model, images: np.ndarray, device: str = "cpu") -> np.ndarray:
    """Unit-length image embeddings of a preprocessed batch (N, 3, S, S)."""
    import torch

    with torch.no_grad():
        features = model.encode_image(torch.from_numpy(np.asarray(images, np.float32)).to(device), normalize=True)
    return features.float().cpu().numpy()


def encode_texts(model, tokens: np.ndarray, device: str = "cpu") -> np.ndarray:
    """Unit-length text embeddings of a tokenized batch (N, context_length)."""
    import torch

    with torch.no_grad():
        features = model.encode_text(torch.as_tensor(np.asarray(tokens)).to(device), normalize=True)
    return features.float().cpu().numpy()


def text_to_image_ranks(image_embeddings: np.ndarray, text_embeddings: np.ndarray) -> np.ndarray:
    """Each text's 0-based rank of its own image (row i's) among all the images: how many are strictly
    closer to the text."""
    n = len(image_embeddings)
    if n == 0:
        raise ValueError("retrieval recall needs at least one item")
    similarity = np.asarray(text_embeddings) @ np.asarray(image_embeddings).T
    own = similarity[np.arange(n), np.arange(n)]
    return (similarity > own[:, None]).sum(axis=1)


def retrieval_recall(
    image_embeddings: np.ndarray, text_embeddings: np.ndarray, ks: tuple[int, ...] = RECALL_KS
) -> dict[str, float]:
    """Text-to-image recall@k: the share of texts whose own image is among the k most similar
    images, beside the random baseline k/n."""
    rank = text_to_image_ranks(image_embeddings, text_embeddings)
    out = {}
    for k in ks:
        out[f"recall@{k}"] = float((rank < k).mean())
        out[f"random_recall@{k}"] = min(1.0, k / len(rank))
    return out


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 30
    batch_size: int = 64
    learning_rate: float = 2e-3
    weight_decay: float = 0.1
    num_workers: int = 1  # 0: Ray Train's local mode, in this process (ml/ray_train.py)
    use_gpu: bool = False
    cpus_per_worker: int = 1  # reserved on Ray and run as torch threads
    seed: int = 0
    placement_strategy: str = "PACK"  # of the workers over the cluster's nodes; STRICT_SPREAD: one per node


def train_clip(
    spec: ClipSpec,
    images: np.ndarray,
    titles: list[str],
    config: TrainConfig,
    output: Path,
    storage: Path | None = None,
) -> list[dict]:
    """Train `spec`'s model with open_clip's ClipLoss as a Ray Train job (TorchTrainer, DDP over
    `num_workers`, GPUs when `use_gpu`), starting from `spec.checkpoint` if given. `images` are
    preprocessed (N, 3, S, S) float32, `titles` their texts. Writes the weights to `output`
    (a state_dict file open_clip loads as a checkpoint) and returns the per-epoch metrics; the last
    epoch's also has `worker_nodes`, the Ray node id of each worker by rank.
    Ray must be started (resources.ray.RayResource.ensure_started)."""
    import ray
    import torch
    from ray.train import ScalingConfig

    if len(images) != len(titles) or len(images) < 2:
        raise ValueError(
            f"training needs >= 2 items with one title each, got {len(images)} images and {len(titles)} titles"
        )
    tokens = tokenizer(spec)(list(titles)).numpy()
    dataset = ray.data.from_items([{"image": im, "tokens": tok} for im, tok in zip(images, tokens)])
    scaling = ScalingConfig(
        num_workers=config.num_workers,
        use_gpu=config.use_gpu,
        resources_per_worker={"CPU": config.cpus_per_worker},
        placement_strategy=config.placement_strategy,
    )
    with (
        tempfile.TemporaryDirectory(prefix="clip-train-") as scratch,
        # checkpoints go to `storage`, which every node must reach (shared storage on a cluster)
        fitted(
            _train_loop, {"spec": spec, "config": config}, scaling, storage or scratch, "clip", {"train": dataset}
        ) as result,
    ):
        if result.error:
            raise RuntimeError(f"CLIP training failed: {result.error}") from result.error
        with result.checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / WEIGHTS_FILE, map_location="cpu", weights_only=True)
            history = [dict(h) for h in torch.load(Path(folder) / "history.pt", weights_only=False)]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    torch.save(state, tmp)
    tmp.replace(output)
    return history


def _train_loop(loop_config: dict) -> None:
    """One Ray Train worker: DDP-wrapped model, its shard of the catalogue, ClipLoss across workers."""
    import ray.train
    import torch
    from ray.train.torch import prepare_model

    open_clip = import_open_clip()
    spec: ClipSpec = loop_config["spec"]
    config: TrainConfig = loop_config["config"]
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.cpus_per_worker)
    context = ray.train.get_context()
    rank = context.get_world_rank()
    checkpoints = EpochCheckpoints(loop_config, rank)
    resumed = checkpoints.resumed()  # after a restart (a lost worker or node): the latest epoch's state
    network = load_model(spec, device="cpu")
    if resumed is not None:
        network.load_state_dict(resumed[WEIGHTS_FILE])  # before the wrap, which syncs rank 0's weights
    model = prepare_model(network.train())
    device = next(model.parameters()).device
    world = context.get_world_size()
    loss_fn = open_clip.ClipLoss(local_loss=False, gather_with_grad=True, rank=rank, world_size=world)
    optimizer = clip_optimizer(model, config, device)
    shard = ray.train.get_dataset_shard("train")
    steps_per_epoch = None
    scheduler = None
    history = []
    if resumed is not None:
        training = resumed[TRAINING_FILE]
        optimizer.load_state_dict(training["optimizer"])
        history, steps_per_epoch = list(training["history"]), training["steps_per_epoch"]
        scheduler = _cosine(optimizer, steps_per_epoch, config)
        scheduler.load_state_dict(training["scheduler"])
        torch.set_rng_state(training["torch_rng"])
    for epoch in range(len(history), config.epochs):
        losses = []
        for batch in shard.iter_torch_batches(
            batch_size=config.batch_size,
            local_shuffle_buffer_size=1024,
            local_shuffle_seed=config.seed + epoch,
            device=device,
        ):
            if len(batch["image"]) < 2:
                continue  # a contrastive batch needs negatives
            image_features, text_features, logit_scale = model(batch["image"].float(), batch["tokens"].long())[:3]
            loss = loss_fn(image_features, text_features, logit_scale)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if scheduler:
                scheduler.step()
            losses.append(float(loss.detach()))
        if steps_per_epoch is None:  # cosine decay once the shard's size is known
            steps_per_epoch = max(1, len(losses))
            scheduler = _cosine(optimizer, steps_per_epoch, config)
        history.append({"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else float("nan")})
        history[-1]["node"] = node_id()
        last = epoch == config.epochs - 1
        if last:
            history[-1]["worker_nodes"] = _worker_nodes(context.get_world_size())
        files = {}
        if rank == 0:
            unwrapped = model.module if hasattr(model, "module") else model
            training = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "history": history}
            training |= {"steps_per_epoch": steps_per_epoch, "torch_rng": torch.get_rng_state()}
            files = {WEIGHTS_FILE: unwrapped.state_dict(), "history.pt": history, TRAINING_FILE: training}
        checkpoints.report(epoch, history[-1], files, last)


def _cosine(optimizer, steps_per_epoch: int, config: TrainConfig):
    import torch

    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps_per_epoch * max(1, config.epochs - 1))


def clip_optimizer(model, config: TrainConfig, device):
    """AdamW, fused: one kernel over every parameter. Tensor by tensor (torch's default on a CPU), the compact
    model's update was a seventh of each training step, its 6.3 M token embeddings most of it
    (benchmarks/clip_training.py)."""
    import torch

    fused = torch.device(device).type in ("cpu", "cuda")
    return torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused)


def _worker_nodes(world_size: int) -> list[str]:
    """The Ray node id of every training worker, by rank (gathered over the process group)."""
    import ray
    import torch.distributed as dist

    node = ray.get_runtime_context().get_node_id()
    if world_size == 1 or not dist.is_initialized():
        return [node]
    nodes: list = [None] * world_size
    dist.all_gather_object(nodes, node)
    return nodes
