"""Export the registry's served models as a Triton model repository: the personalization model's two towers
and the CLIP text and image encoders as TorchScript (what Triton's `pytorch_libtorch` backend runs), each
with its `config.pbtxt`. Plain Python, no Dagster; the KServe manifests are in engines/models/kserve.py.

Layout, in the lake (generated from the registry, so never committed: it changes with every promotion and
holds weights):

    deploy/triton/model_repository/<model>/config.pbtxt                      pytorch_libtorch (the default)
    deploy/triton/model_repository/<model>/configs/python_cpu.pbtxt          Python backend, CPU
    deploy/triton/model_repository/<model>/<registry version>/model.pt      TorchScript
    deploy/triton/model_repository/<model>/<registry version>/model.py      Python-backend model around model.pt
    deploy/triton/model_repository/<model>/<registry version>/source.json   registry model, version, checksum,
                                                                            and how clients encode inputs

Two configurations of the same files, chosen when Triton starts: `config.pbtxt` (the default) runs model.pt on
the `pytorch_libtorch` backend, on the GPUs where the image has any (instance kind AUTO): NGC's Triton images
and KServe's Triton runtime. Images without the libtorch backend (the CPU server of the `nvidia-pytriton`
wheel: Python backend only) start with `--model-config-name python_cpu`, which runs the same model.pt with
torch inside the Python backend (engines/models/triton_python_model.py, copied as model.py).

A Triton model per served model and part (`personalization-user_tower`, `clip_text`, ...), its version
folder named after the registry version and its `version_policy` pinned to the version the server follows,
so a rollback to an older version is served by Triton too (a `latest` policy would keep the newest).

The towers take the tensors `ml.personalization.TowerSpec.encode` makes of feature columns (ids, scaled
numeric values, category indexes, padded histories, embeddings; source.json holds the spec); the encoders
take open_clip tokens (`ml.clip.tokenizer`) and preprocessed pixels (`ml.clip.preprocess_image`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sysconfig
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from engines.models.kinds import EXPORTED_KINDS
from ml.clip import ClipSpec, image_size, load_model
from ml.personalization import PersonalizationModel, TowerSpec

TRITON_REPOSITORY = Path("deploy") / "triton" / "model_repository"  # under the lake root
MODEL_FILE, SOURCE_FILE, CONFIG_FILE = "model.pt", "source.json", "config.pbtxt"
PYTHON_MODEL_FILE = "model.py"
PYTHON_CONFIG_NAME = "python_cpu"  # tritonserver --model-config-name python_cpu
PYTHON_MODEL_SOURCE = Path(__file__).with_name("triton_python_model.py")
CLIP_WEIGHTS, CLIP_CONFIG = "clip.pt", "clip.json"  # a registered CLIP folder (assets/serving.py writes it)
MAX_BATCH = 64
HISTORY_LENGTH = 10  # ml.personalization._padded_ids
TRITON_TYPES = {torch.float32: "TYPE_FP32", torch.int64: "TYPE_INT64"}


@dataclass(frozen=True)
class ExportTarget:
    """One served model resolved to the registry version it serves now."""

    name: str  # the model server's name for it
    registry_model: str
    kind: str  # engines/models/kinds.py
    version: str
    follows: str  # "alias 'champion'" or "version 3"
    checksum: str  # the registry's checksum of the artifact (engines.models.registry.CHECKSUM_TAG)


@dataclass(frozen=True)
class TritonTensor:
    name: str
    data_type: str  # TYPE_FP32, TYPE_INT64
    dims: tuple[int, ...]  # without the batch dimension
    reshape: tuple[int, ...] | None = None  # a per-row scalar travels as dims [1], reshaped to []


@dataclass(frozen=True)
class TritonModel:
    name: str
    part: str  # user_tower, item_tower, text, image
    target: ExportTarget
    inputs: tuple[TritonTensor, ...]
    outputs: tuple[TritonTensor, ...]

    def folder(self, repository: Path) -> Path:
        return repository / self.name

    def model_file(self, repository: Path) -> Path:
        return repository / self.name / self.target.version / MODEL_FILE


def triton_name(target: ExportTarget, part: str) -> str:
    return f"{target.name}-{part}" if target.kind == "two_tower" else target.name


# --- the exported modules -------------------------------------------------------------------------
class TowerModule(nn.Module):
    """One side of the two-tower network on the dict of tensors TowerSpec.encode makes (Triton passes a
    single Dict[str, Tensor] argument keyed by the config's input names): the network's own user_vectors
    or item_vectors, so the user's constant 1 and the item's bias plus popularity prior are exported
    with the towers (the bare item tower lacks the prior)."""

    def __init__(self, network: nn.Module, part: str, absent: frozenset[str]):
        super().__init__()
        self.network = network
        self.part = part
        self.absent = absent  # inputs of zero width (no numeric or categorical columns): made inside

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = inputs["ids"]
        full = dict(inputs)
        if "numeric" in self.absent:
            full["numeric"] = ids.new_zeros((ids.shape[0], 0), dtype=torch.float32)
        if "categorical" in self.absent:
            full["categorical"] = ids.new_zeros((ids.shape[0], 0))
        return self.network.user_vectors(full) if self.part == "user_tower" else self.network.item_vectors(full)


class TextEncoderModule(nn.Module):
    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip = clip

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_text(tokens, normalize=True)


class ImageEncoderModule(nn.Module):
    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip = clip

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_image(pixels, normalize=True)


def tower_inputs(spec: TowerSpec) -> tuple[TritonTensor, ...]:
    """The tensors TowerSpec.encode makes, as Triton inputs (zero-width ones are left out)."""
    inputs = [TritonTensor("ids", "TYPE_INT64", (1,), reshape=())]
    if spec.numeric:
        inputs.append(TritonTensor("numeric", "TYPE_FP32", (len(spec.numeric),)))
    if spec.categorical:
        inputs.append(TritonTensor("categorical", "TYPE_INT64", (len(spec.categorical),)))
    inputs += [TritonTensor(f"history{i}", "TYPE_INT64", (HISTORY_LENGTH,)) for i in range(len(spec.histories))]
    if spec.embedding_column:
        inputs.append(TritonTensor("embedding", "TYPE_FP32", (spec.embedding_dim,)))
    return tuple(inputs)


def example_inputs(inputs: tuple[TritonTensor, ...], rows: int = 3) -> dict[str, torch.Tensor]:
    """Tensors of the inputs' shapes and types (what a trace records is independent of the values)."""
    out = {}
    for tensor in inputs:
        shape = (rows, *(tensor.reshape if tensor.reshape is not None else tensor.dims))
        out[tensor.name] = (
            torch.zeros(shape, dtype=torch.float32)
            if tensor.data_type == "TYPE_FP32"
            else torch.ones(shape, dtype=torch.int64)
        )
    return out


def trace(module: nn.Module, example) -> torch.jit.ScriptModule:
    with torch.no_grad(), _jit_deprecation_hushed(), warnings.catch_warnings():
        # attention's shape asserts become constants of the trace; export_check runs every export at
        # several batch sizes, which is what would show a shape frozen into it
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        return torch.jit.trace(module.eval(), example, strict=False, check_trace=False)


@contextlib.contextmanager
def _jit_deprecation_hushed():
    """torch 2.14 marks torch.jit deprecated in favour of torch.export; Triton's libtorch backend runs
    TorchScript, so the export writes it until the backend's torch.export (PT2) path is the norm."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit.*")
        yield


def export_towers(target: ExportTarget, folder: Path) -> list[tuple[TritonModel, torch.jit.ScriptModule, dict]]:
    model = PersonalizationModel.load(folder)
    network = model.network
    out = []
    for part, spec in (("user_tower", model.spec.user), ("item_tower", model.spec.item)):
        inputs = tower_inputs(spec)
        absent = frozenset(
            k for k, columns in (("numeric", spec.numeric), ("categorical", spec.categorical)) if not columns
        )
        module = TowerModule(network, part, absent)
        dim = model.spec.config.dim + 1  # the user's 1 or the item's bias
        output = TritonTensor("user_vector" if part == "user_tower" else "item_vector", "TYPE_FP32", (dim,))
        triton = TritonModel(triton_name(target, part), part, target, inputs, (output,))
        out.append((triton, trace(module, (example_inputs(inputs),)), {"tower_spec": asdict(spec)}))
    return out


def registered_clip_spec(folder: Path) -> ClipSpec:
    config = json.loads((folder / CLIP_CONFIG).read_text())
    return ClipSpec(config["model_name"], str(folder / CLIP_WEIGHTS))


def export_encoder(target: ExportTarget, folder: Path) -> list[tuple[TritonModel, torch.jit.ScriptModule, dict]]:
    spec = registered_clip_spec(folder)
    clip = load_model(spec)
    dim = int(clip.text_projection.shape[1]) if target.kind == "clip_text" else int(clip.visual.output_dim)
    if target.kind == "clip_text":
        context = int(clip.context_length)
        inputs = (TritonTensor("tokens", "TYPE_INT64", (context,)),)
        module: nn.Module = TextEncoderModule(clip)
    else:
        size = image_size(clip)
        inputs = (TritonTensor("pixels", "TYPE_FP32", (3, size, size)),)
        module = ImageEncoderModule(clip)
    example = next(iter(example_inputs(inputs).values()))
    triton = TritonModel(
        triton_name(target, EXPORTED_KINDS[target.kind][0]),
        EXPORTED_KINDS[target.kind][0],
        target,
        inputs,
        (TritonTensor("embedding", "TYPE_FP32", (dim,)),),
    )
    return [(triton, trace(module, (example,)), {"open_clip_model": spec.model_name})]


# --- the repository ---------------------------------------------------------------------------------
def config_pbtxt(model: TritonModel, backend: str = "libtorch") -> str:
    """The model's config.pbtxt, built as Triton's ModelConfig protobuf (tritonclient ships it) and
    printed in its text format, so every field name and value is one Triton parses. `backend`: libtorch
    (config.pbtxt) or python (configs/python_cpu.pbtxt, the same model.pt run by model.py)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = mc.ModelConfig(name=model.name, max_batch_size=MAX_BATCH)
    config.version_policy.specific.versions.append(int(model.target.version))
    for tensors, field in ((model.inputs, config.input), (model.outputs, config.output)):
        for tensor in tensors:
            entry = field.add(name=tensor.name, data_type=mc.DataType.Value(tensor.data_type), dims=tensor.dims)
            if tensor.reshape is not None:
                entry.reshape.shape.extend(tensor.reshape)
    config.dynamic_batching.SetInParent()
    if backend == "libtorch":
        config.platform = "pytorch_libtorch"
        config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_AUTO, count=1)  # GPUs where there are any
        config.parameters["INFERENCE_MODE"].string_value = "true"
    else:
        config.backend = "python"
        config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
        # model.py imports torch from the environment that wrote model.pt (the backend's stub has its own path)
        config.parameters["site_packages"].string_value = sysconfig.get_paths()["purelib"]
        config.parameters["torchscript_input"].string_value = "dict" if model.part.endswith("tower") else "tensor"
    return text_format.MessageToString(config)


def python_config_file(model_folder: Path) -> Path:
    return model_folder / "configs" / f"{PYTHON_CONFIG_NAME}.pbtxt"


def parse_config(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    return text_format.Parse(text, mc.ModelConfig())


def export_target(target: ExportTarget, folder: Path, repository: Path) -> list[TritonModel]:
    """Write `target`'s Triton models from its verified registry folder into `repository` (a staging
    one: `publish` moves them into the live repository once they are checked)."""
    if target.kind not in EXPORTED_KINDS:
        raise ValueError(f"{target.name}: kind {target.kind!r} has no Triton export (only {sorted(EXPORTED_KINDS)})")
    exported = export_towers(target, folder) if target.kind == "two_tower" else export_encoder(target, folder)
    for model, script, encoding in exported:
        version_dir = model.folder(repository) / target.version
        version_dir.mkdir(parents=True, exist_ok=True)
        with _jit_deprecation_hushed():
            torch.jit.save(script, str(version_dir / MODEL_FILE))
        source = {
            "registry_model": target.registry_model,
            "version": target.version,
            "checksum": target.checksum,
            "served_as": target.name,
            "follows": target.follows,
            "part": model.part,
            "torch": torch.__version__,
            **encoding,
        }
        (version_dir / SOURCE_FILE).write_text(json.dumps(source, indent=2))
        shutil.copyfile(PYTHON_MODEL_SOURCE, version_dir / PYTHON_MODEL_FILE)
        (model.folder(repository) / CONFIG_FILE).write_text(config_pbtxt(model))
        python_config = python_config_file(model.folder(repository))
        python_config.parent.mkdir(exist_ok=True)
        python_config.write_text(config_pbtxt(model, backend="python"))
    return [model for model, _, _ in exported]


def publish(staging: Path, repository: Path, models: list[TritonModel]) -> dict[str, list[str]]:
    """Move checked models from `staging` into the live `repository` so that a Triton polling it never
    reads half a model: a version folder is renamed into place (one already there from the same artifact,
    same checksum, is kept; older versions stay for rollbacks), then config.pbtxt, which pins the version,
    is replaced atomically (and the Python backend's, configs/python_cpu.pbtxt). Models no served model
    exports any more are removed."""
    changed, kept = [], []
    repository.mkdir(parents=True, exist_ok=True)
    for model in models:
        live = model.folder(repository) / model.target.version
        if _source(live).get("checksum") == model.target.checksum and (live / MODEL_FILE).exists():
            kept.append(model.name)
        else:
            live.parent.mkdir(parents=True, exist_ok=True)
            incoming = live.with_name(f".{live.name}.incoming")
            shutil.rmtree(incoming, ignore_errors=True)
            shutil.copytree(model.folder(staging) / model.target.version, incoming)
            if live.exists():
                shutil.rmtree(live)
            incoming.rename(live)
            changed.append(model.name)
        _write_atomically(model.folder(repository) / CONFIG_FILE, (model.folder(staging) / CONFIG_FILE).read_text())
        python_config = python_config_file(model.folder(repository))
        python_config.parent.mkdir(exist_ok=True)
        _write_atomically(python_config, python_config_file(model.folder(staging)).read_text())
    wanted = {m.name for m in models}
    removed = [
        f.name
        for f in sorted(repository.iterdir())
        if f.is_dir() and f.name not in wanted and not f.name.startswith(".")
    ]
    for name in removed:
        shutil.rmtree(repository / name)
    return {"written": changed, "unchanged": kept, "removed": removed}


def load_exported(repository: Path, model: TritonModel) -> torch.jit.ScriptModule:
    """The exported TorchScript loaded as Triton's libtorch backend loads it (torch.jit.load)."""
    with _jit_deprecation_hushed():
        return torch.jit.load(str(model.model_file(repository)), map_location="cpu").eval()


def _source(version_dir: Path) -> dict:
    try:
        return json.loads((version_dir / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
