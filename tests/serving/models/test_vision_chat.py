"""The vision-language model served by the model server (vLLM's CPU build cannot load it here): OpenAI's
chat completions with an image, streamed or not, the same model over the Open Inference Protocol, and the
gateway's `vision: true` path in front of it. The model is a real LLaVA folder built from the platform's
parts with random CLIP weights and a briefly trained Llama (the answers must match a recomputation, not
be good ones); its caption quality is tested in tests/assets/test_embeddings.py."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import pytest
import torch

from engines.models.registry import ModelRegistry
from ml.clip import COMPACT_MODEL, register_model_configs
from ml.llm import LlmConfig, train_llm
from ml.vision_llm import PROMPT, assemble, generate_captions, prompt_text
from serving.models.config import VISION_CAPTIONER, ServerConfig
from simulator.thumbnails import render
from tests.serving.conftest import GatewayProcess
from tests.serving.models.conftest import start_server

pytestmark = pytest.mark.services  # a model server and a gateway process


@pytest.fixture(scope="module")
def captioner_folder(tmp_path_factory):
    import open_clip

    root = tmp_path_factory.mktemp("captioner")
    register_model_configs()
    torch.manual_seed(5)
    clip = open_clip.create_model(COMPACT_MODEL).eval()
    titles = ["Red plain cosy car", "Blue striped tiny sofa", "Green dotted magic dog"] * 40
    train_llm(titles, root / "llm", LlmConfig(vocab_size=300, steps=30, context=16), log=lambda _: None)
    model, processor = assemble(clip, open_clip.get_model_config(COMPACT_MODEL)["vision_cfg"], root / "llm")
    model.save_pretrained(root / "vlm")
    processor.save_pretrained(root / "vlm")
    return root


@pytest.fixture(scope="module")
def vision_server(captioner_folder):
    registry = ModelRegistry.local(captioner_folder / "registry")
    version = registry.register("vision_captioner", captioner_folder / "vlm", {"mlplane.llm_role": "vision"}, {})
    registry.set_alias("vision_captioner", "champion", version.version, who="test", reason="fixture")
    config = ServerConfig(
        registry_root=str(captioner_folder / "registry"),
        lake_root=str(captioner_folder / "lake"),
        models=[VISION_CAPTIONER],
        feature_log_sample=0.0,
    )
    running = start_server(config)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference(captioner_folder):
    """The model and processor loaded from the folder by transformers alone, for recomputing answers."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    folder = captioner_folder / "vlm"
    return LlavaForConditionalGeneration.from_pretrained(folder).eval(), AutoProcessor.from_pretrained(folder)


def thumbnail(seed: int) -> tuple[np.ndarray, str]:
    """(RGB pixels, PNG data URL) of a simulated catalogue thumbnail."""
    from PIL import Image

    pixels = render("furniture", "blue", "striped", seed)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    return pixels, "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()


def chat_body(url: str, question: str | None = None, **fields) -> dict:
    content = [{"type": "image_url", "image_url": {"url": url}}]
    if question:
        content.insert(0, {"type": "text", "text": question})
    return {"model": "vision_captioner", "messages": [{"role": "user", "content": content}], **fields}


def test_chat_answers_equal_a_recomputation_from_the_registered_folder(vision_server, reference):
    model, processor = reference
    pixels, url = thumbnail(1)
    answer = httpx.post(f"{vision_server.url}/v1/chat/completions", json=chat_body(url, max_tokens=6), timeout=60)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected = generate_captions(model, processor, [pixels], max_new_tokens=6)[0]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": expected}
    prompt_ids = processor(images=[pixels], text=[prompt_text(processor)], return_tensors="pt")["input_ids"]
    assert body["usage"]["prompt_tokens"] == prompt_ids.shape[1]  # the image's patch tokens included
    assert 1 <= body["usage"]["completion_tokens"] <= 6
    assert body["choices"][0]["finish_reason"] in ("stop", "length") and body["model"] == "vision_captioner"

    asked = httpx.post(
        f"{vision_server.url}/v1/chat/completions", json=chat_body(url, "What is it?", max_tokens=6), timeout=60
    ).json()
    inputs = processor(images=[pixels], text=[prompt_text(processor, "What is it?")], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    own = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    assert asked["choices"][0]["message"]["content"] == own  # the question is the user's text
    assert asked["usage"]["prompt_tokens"] == inputs["input_ids"].shape[1] != body["usage"]["prompt_tokens"]


def test_a_streamed_answer_carries_the_same_text_and_its_usage(vision_server):
    _, url = thumbnail(2)
    plain = httpx.post(f"{vision_server.url}/v1/chat/completions", json=chat_body(url, max_tokens=8), timeout=60).json()
    body = chat_body(url, max_tokens=8, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", f"{vision_server.url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert events[-1]["usage"] == plain["usage"] and events[-2]["choices"][0]["finish_reason"]


def test_the_same_model_over_the_inference_protocol(vision_server, reference):
    model, processor = reference
    pixels, url = thumbnail(3)
    image = url.partition(",")[2]
    body = {
        "inputs": [
            {
                "name": "image",
                "datatype": "BYTES",
                "shape": [1],
                "data": [image],
                "parameters": {"binary_encoding": "base64"},
            }
        ],
        "parameters": {"max_new_tokens": 5},
    }
    answer = httpx.post(f"{vision_server.url}/v2/models/vision_captioner/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs["text"] == [generate_captions(model, processor, [pixels], max_new_tokens=5)[0]]
    metadata = httpx.get(f"{vision_server.url}/v2/models/vision_captioner", timeout=10).json()
    assert metadata["platform"] == "transformers_llava" and metadata["parameters"]["default_prompt"] == PROMPT


@pytest.mark.parametrize(
    ("change", "status", "names"),
    [
        ({"model": "nope"}, 404, "vision_captioner"),
        ({"n": 2}, 400, "n must be 1"),
        ({"max_tokens": 100_000}, 400, "max_tokens must be at most 256"),
        ({"temperature": 5}, 400, "temperature"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "no image here"}]}, 400, "exactly one image_url"),
        ({"image": "https://example.com/cat.png"}, 400, "data URL"),
        ({"image": "data:image/png;base64,%%%"}, 400, "base64"),
        ({"image": "data:image/png;base64," + base64.b64encode(b"not a png").decode()}, 400, "not a readable image"),
        ({"two_images": True}, 400, "exactly one image_url"),
        ({"system": True}, 400, "one user message"),
    ],
)
def test_requests_the_model_cannot_answer_get_a_4xx_naming_the_problem(vision_server, change, status, names):
    change = dict(change)
    _, url = thumbnail(4)
    body = chat_body(change.pop("image", url))
    if change.pop("two_images", False):
        body["messages"][0]["content"] *= 2
    if change.pop("system", False):
        body["messages"].insert(0, {"role": "system", "content": "Be brief."})
    body.update(change)
    answer = httpx.post(f"{vision_server.url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert names in error["message"] and error["type"] == "invalid_request_error"


def test_the_gateway_routes_image_chats_to_the_model_server(vision_server, tmp_path):
    """The gateway's path for images is the one it has for vLLM: a `vision: true` entry (kind openai)."""
    config = {
        "model_list": [
            {"model_name": "captioner", "url": vision_server.url, "model": "vision_captioner", "vision": True},
            {"model_name": "text-only", "url": vision_server.url, "model": "vision_captioner"},
        ],
        "settings": {"store": f"sqlite:///{tmp_path}/gateway.db", "health_interval_s": 1, "max_attempts": 1},
    }
    gateway = GatewayProcess(config, tmp_path)
    try:
        key = gateway.key(models=["captioner", "text-only"])
        auth = {"Authorization": f"Bearer {key}"}
        _, url = thumbnail(5)
        direct = httpx.post(f"{vision_server.url}/v1/chat/completions", json=chat_body(url, max_tokens=6), timeout=60)
        through = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={**chat_body(url, max_tokens=6), "model": "captioner"},
            headers=auth,
        )
        assert through.status_code == 200, through.text
        assert through.json()["choices"] == direct.json()["choices"] and through.json()["model"] == "captioner"
        refused = httpx.post(
            f"{gateway.url}/v1/chat/completions", json={**chat_body(url), "model": "text-only"}, headers=auth
        )
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "images_not_supported"
        remote = {**chat_body("https://example.com/x.png"), "model": "captioner"}
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=remote, headers=auth).status_code == 400
        deadline = time.time() + 20
        while True:  # usage is written asynchronously: the answer's own token counts
            rows = [r for r in gateway.store.usage_report(group_by=("model", "status")) if r["model"] == "captioner"]
            if any(r["status"] == 200 for r in rows) or time.time() > deadline:
                break
            time.sleep(0.2)
        ok = next(r for r in rows if r["status"] == 200)
        usage = direct.json()["usage"]
        assert (ok["prompt_tokens"], ok["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    finally:
        gateway.stop()


def test_health_waits_for_every_chat_model(vision_server, tmp_path):
    """The gateway's probe: healthy only when its chat model serves a version."""
    assert httpx.get(f"{vision_server.url}/health", timeout=10).status_code == 200
    listed = httpx.get(f"{vision_server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in listed["data"]] == ["vision_captioner"]
    ModelRegistry.local(tmp_path / "registry")  # empty: no champion to serve
    config = ServerConfig(
        registry_root=str(tmp_path / "registry"), lake_root=str(tmp_path / "lake"), models=[VISION_CAPTIONER]
    )
    empty = start_server(config)
    try:
        waiting = httpx.get(f"{empty.url}/health", timeout=10)
        assert waiting.status_code == 503 and "vision_captioner" in waiting.json()["waiting"]
    finally:
        empty.stop()
