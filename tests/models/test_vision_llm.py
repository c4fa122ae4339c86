"""The vision-language model's parts (ml/vision_llm.py) without training it: open_clip's image tower
converted to transformers' CLIPVisionModel gives the same CLIP embeddings, the assembled model and
its processor round-trip through the Hugging Face folder, and the processor sees a thumbnail exactly
as the platform's CLIP preprocessing does. Training and caption quality: tests/assets/test_embeddings.py."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from ml.clip import COMPACT_MODEL, preprocess_image, register_model_configs
from ml.llm import LlmConfig, train_llm
from ml.vision_llm import (
    assemble,
    generate_captions,
    text_only_baseline,
    vision_tower,
    word_accuracy,
)
from simulator.thumbnails import render


@pytest.fixture(scope="module")
def compact_clip():
    import open_clip

    register_model_configs()
    torch.manual_seed(3)
    model = open_clip.create_model(COMPACT_MODEL).eval()
    return model, open_clip.get_model_config(COMPACT_MODEL)["vision_cfg"]


def thumbnails(n: int) -> list[np.ndarray]:
    kinds = [("vehicle", "red", "plain"), ("furniture", "blue", "striped"), ("pet", "green", "dotted")]
    return [render(category, colour, material, seed) for seed, (category, colour, material) in enumerate(kinds[:n])]


def test_the_converted_image_tower_gives_clips_image_embeddings(compact_clip):
    clip, vision_cfg = compact_clip
    tower = vision_tower(clip, vision_cfg)
    images = torch.randn(3, 3, vision_cfg["image_size"], vision_cfg["image_size"])
    with torch.no_grad():
        expected = clip.encode_image(images)
        converted = tower(pixel_values=images).pooler_output @ clip.visual.proj
    assert torch.allclose(converted, expected, atol=1e-5), (converted - expected).abs().max()


def test_the_assembled_model_round_trips_through_its_hugging_face_folder(compact_clip, tmp_path):
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    clip, vision_cfg = compact_clip
    titles = ["Red plain cosy car", "Blue striped tiny sofa", "Green dotted magic dog"] * 40
    train_llm(titles, tmp_path / "llm", LlmConfig(vocab_size=300, steps=2, context=16), log=lambda _: None)
    model, processor = assemble(clip, vision_cfg, tmp_path / "llm")
    images = thumbnails(3)
    before = generate_captions(model, processor, images, max_new_tokens=6)
    model.save_pretrained(tmp_path / "vlm")
    processor.save_pretrained(tmp_path / "vlm")

    loaded = LlavaForConditionalGeneration.from_pretrained(tmp_path / "vlm").eval()
    loaded_processor = AutoProcessor.from_pretrained(tmp_path / "vlm")
    assert generate_captions(loaded, loaded_processor, images, max_new_tokens=6) == before
    png = io.BytesIO()
    Image.fromarray(images[0]).save(png, format="PNG")
    pixels = loaded_processor.image_processor(images=[images[0]], return_tensors="np")["pixel_values"][0]
    assert np.allclose(pixels, preprocess_image(png.getvalue(), vision_cfg["image_size"]), atol=1e-5)
    tokens = loaded_processor(images=images[:1], text=["<image>hi"], return_tensors="pt")["input_ids"][0]
    side = vision_cfg["image_size"] // vision_cfg["patch_size"]
    assert int((tokens == loaded.config.image_token_index).sum()) == side * side  # one per patch


def test_word_accuracy_and_the_text_only_baseline():
    assert word_accuracy(["Red plain cosy car", "blue"], ["red plain tiny car", "Blue striped sofa"]) == pytest.approx(
        (3 / 4 + 1 / 3) / 2
    )
    titles = ["Red plain cosy car", "Red dotted tiny car", "Blue plain cosy dog"]
    assert text_only_baseline(titles, 4) == "red plain cosy car"
