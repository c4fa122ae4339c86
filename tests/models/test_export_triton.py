"""The Triton export loaded by a real NVIDIA Triton Inference Server (2.51, CPU, Python backend, from the
`nvidia-pytriton` wheel in .venv-triton; engines/models/triton_server.py): the same inputs sent with `tritonclient`
(HTTP) to Triton, encoded as the export's config.pbtxt declares them, and to our model server as its clients
send them (feature columns, texts, PNG bytes), and the outputs compared. Real registry models with random
weights: an export must reproduce a model, not a good one."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import np_to_triton_dtype

from engines.models.model_export import PYTHON_CONFIG_NAME, export_target, parse_config, python_config_file
from engines.models.registry import ModelRegistry
from engines.models.triton_server import running_triton
from ml.clip import ClipSpec, preprocess_image, tokenizer
from ml.personalization import PersonalizationModel
from serving.models.config import ModelEntry, ServerConfig
from serving.models.export_check import ATOL, RTOL, _frame, random_columns
from serving.models.kinds.towers import HISTORY_PAD, ItemIndex
from tests.engines.test_model_export import target
from tests.serving.models.conftest import register_random_clip, register_two_tower, start_server

pytestmark = pytest.mark.services  # starts tritonserver and the model server
ROWS = 24


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The registry's towers and CLIP exported into one repository, Triton over it, our server over the
    registry."""
    root = tmp_path_factory.mktemp("triton")
    registry = ModelRegistry.local(root / "registry")
    register_two_tower(registry, root, seed=1, alias="champion")
    register_random_clip(registry, root / "clip")
    repository, folders = root / "repository", {}
    for t in (
        target(registry, "personalization", "personalization", "two_tower", "1"),
        target(registry, "clip_text", "clip", "clip_text", "1"),
        target(registry, "clip_image", "clip", "clip_image", "1"),
    ):
        folder = registry.load(t.registry_model, t.version, root / "artifacts" / t.name)
        folders |= {model.name: folder for model in export_target(t, folder, repository)}
    ours = start_server(
        ServerConfig(
            registry_root=str(root / "registry"),
            lake_root=str(root / "lake"),
            models=[
                ModelEntry(name="personalization", registry_model="personalization", kind="two_tower"),
                ModelEntry(name="clip_text", registry_model="clip", kind="clip_text"),
                ModelEntry(name="clip_image", registry_model="clip", kind="clip_image"),
            ],
            feature_log_sample=0.0,
        )
    )
    try:
        with running_triton(repository, root / "triton.log", env={"OMP_NUM_THREADS": "1"}) as triton:
            yield {
                "triton": triton_http.InferenceServerClient(triton.url),
                "ours": triton_http.InferenceServerClient(ours.url.removeprefix("http://")),
                "repository": repository,
                "folders": folders,
            }
    finally:
        ours.stop()


def infer(client, model: str, arrays: dict[str, np.ndarray], output: str) -> np.ndarray:
    inputs = []
    for name, array in arrays.items():
        tensor = triton_http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    requested = [triton_http.InferRequestedOutput(output, binary_data=True)]
    return client.infer(model, inputs, outputs=requested).as_numpy(output)


def assert_equal_within_tolerance(triton: np.ndarray, ours: np.ndarray) -> None:
    assert triton.shape == ours.shape and triton.dtype == np.float32
    diff = np.abs(triton.astype(np.float64) - ours.astype(np.float64))
    assert np.all(diff <= ATOL + RTOL * np.abs(ours)), diff.max()
    assert np.abs(ours).max() > 1e-2  # a non-trivial output: equality of zeros would prove nothing


def test_triton_loads_every_export_with_the_python_backend(servers):
    client = servers["triton"]
    assert client.is_server_ready()
    for name in servers["folders"]:
        assert client.is_model_ready(name, "1"), name
        served = client.get_model_config(name)
        written = parse_config(python_config_file(servers["repository"] / name).read_text())
        assert served["backend"] == "python" and served["name"] == name
        assert [i["name"] for i in served["input"]] == [i.name for i in written.input]
    assert PYTHON_CONFIG_NAME == "python_cpu"


def test_user_tower_outputs_equal_ours(servers):
    spec = PersonalizationModel.load(servers["folders"]["personalization-user_tower"]).spec.user
    columns = random_columns(spec, np.random.default_rng(0), ROWS)
    for column in spec.numeric:  # the v2 protocol carries a missing number as NaN
        columns[column] = [np.nan if v is None else v for v in columns[column]]
    for column in spec.categorical:  # and a category as bytes: unseen ones, not missing ones
        columns[column] = ["never-seen" if v is None else v for v in columns[column]]
    sent = {spec.id_column: np.asarray(columns[spec.id_column], dtype=np.int64)}
    sent |= {c: np.asarray(columns[c], dtype=np.float64) for c in spec.numeric}
    sent |= {c: np.asarray([v.encode() for v in columns[c]], dtype=object) for c in spec.categorical}
    for c in spec.histories:
        width = max(1, *(len(h) for h in columns[c]))
        sent[c] = np.asarray([h + [HISTORY_PAD] * (width - len(h)) for h in columns[c]], dtype=np.int64)
    ours = infer(servers["ours"], "personalization", sent, "user_vector")
    encoded = {k: v.numpy() for k, v in spec.encode(_frame(spec, columns)).items() if v.numel()}
    encoded["ids"] = encoded["ids"].reshape(-1, 1)  # dims [1], reshaped to a scalar per row by Triton
    triton = infer(servers["triton"], "personalization-user_tower", encoded, "user_vector")
    assert_equal_within_tolerance(triton, ours)


def test_item_tower_outputs_equal_the_served_catalogue_vectors(servers):
    model = PersonalizationModel.load(servers["folders"]["personalization-item_tower"])
    items = _frame(model.spec.item, random_columns(model.spec.item, np.random.default_rng(1), ROWS))
    ours = ItemIndex.build(model, items).vectors  # what the server scores recommendations with
    encoded = {k: v.numpy() for k, v in model.spec.item.encode(items).items() if v.numel()}
    encoded["ids"] = encoded["ids"].reshape(-1, 1)
    assert_equal_within_tolerance(infer(servers["triton"], "personalization-item_tower", encoded, "item_vector"), ours)


def test_clip_text_outputs_equal_ours(servers):
    texts = ["red castle", "low-poly robot with a sword", "", "ü neon ship " * 30]  # empty; past the context
    sent = {"text": np.asarray([t.encode() for t in texts], dtype=object)}
    ours = infer(servers["ours"], "clip_text", sent, "embedding")
    tokens = tokenizer(ClipSpec())(texts).numpy().astype(np.int64)
    assert_equal_within_tolerance(infer(servers["triton"], "clip_text", {"tokens": tokens}, "embedding"), ours)


def test_clip_image_outputs_equal_ours(servers):
    from PIL import Image

    rng = np.random.default_rng(2)
    images = []
    for size in (16, 64, 97):  # smaller, equal to and larger than the model's size: resized
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, format="PNG")
        images.append(buffer.getvalue())
    ours = infer(servers["ours"], "clip_image", {"image": np.asarray(images, dtype=object)}, "embedding")
    side = int(servers["triton"].get_model_metadata("clip_image")["inputs"][0]["shape"][-1])
    pixels = np.stack([preprocess_image(data, side) for data in images]).astype(np.float32)
    assert_equal_within_tolerance(infer(servers["triton"], "clip_image", {"pixels": pixels}, "embedding"), ours)
