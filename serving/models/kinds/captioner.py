"""The vision-language model (`vision_captioner`, ml/vision_llm.py) as a served model: a registered
LLaVA folder answering a question about an image. Over the Open Inference Protocol its inputs are the
image's bytes (PNG, JPEG, WebP or GIF) and an optional question; the OpenAI chat route
(serving/models/protocols/openai_api.py) puts chat messages into the same call, so both are one code path with
the same checks, metrics and prediction log.

vLLM's CPU build cannot load the folder here (ml/vision_llm.py says why), so this server is where the
gateway's `vision: true` backends point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ml.clip import ImageTooLarge, open_image
from ml.vision_llm import PROMPT, answer_about_image
from serving.models.kinds.base import ServedModel
from serving.models.protocols.protocol import ProtocolError, TensorSpec

MAX_NEW_TOKENS = 256  # the Llama's context is short; longer answers are refused, not cut silently
TRAINING_FILE = "mlplane_training.json"  # written by the models/vision_captioner asset


class VisionCaptioner(ServedModel):
    platform = "transformers_llava"
    inputs = [TensorSpec("image", "BYTES", (-1,)), TensorSpec("prompt", "BYTES", (-1,), optional=True)]
    outputs = [
        TensorSpec("text", "BYTES", (-1,)),
        TensorSpec("prompt_tokens", "INT32", (-1,)),
        TensorSpec("completion_tokens", "INT32", (-1,)),
        TensorSpec("finish_reason", "BYTES", (-1,)),
    ]

    def __init__(self, folder: Path, device: str = "cpu", max_pixels: int | None = None):
        import torch
        from transformers import AutoProcessor, LlavaForConditionalGeneration

        torch.set_num_threads(1)  # requests run side by side in the server's threads
        self.device = device
        self.max_pixels = max_pixels
        self.model = LlavaForConditionalGeneration.from_pretrained(folder).to(device).eval()
        self.processor = AutoProcessor.from_pretrained(folder)
        trained = json.loads((folder / TRAINING_FILE).read_text()) if (folder / TRAINING_FILE).exists() else {}
        self.default_tokens = int(trained.get("config", {}).get("max_caption_tokens", 16)) + 1  # and its end

    def parameters(self) -> dict:
        return {"default_max_new_tokens": self.default_tokens, "default_prompt": PROMPT}

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict) -> dict[str, np.ndarray]:
        images = [_decode_image(i, data, self.max_pixels) for i, data in enumerate(inputs["image"].tolist())]
        prompts = _prompts(inputs.get("prompt"), len(images))
        options = _generation_options(parameters, self.default_tokens)
        answers = [
            answer_about_image(self.model, self.processor, image, prompt, **options)
            for image, prompt in zip(images, prompts)
        ]
        return {
            "text": np.array([a.text.encode() for a in answers], dtype=object),
            "prompt_tokens": np.array([a.prompt_tokens for a in answers], np.int32),
            "completion_tokens": np.array([a.completion_tokens for a in answers], np.int32),
            "finish_reason": np.array([a.finish_reason.encode() for a in answers], dtype=object),
        }


def _decode_image(index: int, data: bytes, max_pixels: int | None) -> np.ndarray:
    try:
        with open_image(data, max_pixels) as image:
            return np.asarray(image.convert("RGB"))
    except ImageTooLarge as error:
        raise ProtocolError(413, f"input 'image'[{index}]: {error} (max_image_pixels)") from error
    except Exception as error:
        raise ProtocolError(400, f"input 'image'[{index}] is not a readable image: {error}") from error


def _prompts(values: np.ndarray | None, count: int) -> list[str]:
    """One question per image: none (the trained one), one for all, or one each."""
    if values is None:
        return [PROMPT] * count
    texts = [v.decode(errors="replace") for v in values.tolist()]
    if len(texts) == 1:
        return texts * count
    if len(texts) != count:
        raise ProtocolError(400, f"input 'prompt' has {len(texts)} values for {count} images (give 1 or {count})")
    return texts


def _generation_options(parameters: dict, default_tokens: int) -> dict:
    tokens = parameters.get("max_new_tokens", default_tokens)
    if type(tokens) is not int or not 1 <= tokens <= MAX_NEW_TOKENS:
        raise ProtocolError(400, f"parameter 'max_new_tokens' must be an integer in 1..{MAX_NEW_TOKENS}")
    temperature, top_p = parameters.get("temperature", 0.0), parameters.get("top_p", 1.0)
    if type(temperature) not in (int, float) or not 0 <= temperature <= 2:
        raise ProtocolError(400, "parameter 'temperature' must be a number in [0, 2]")
    if type(top_p) not in (int, float) or not 0 < top_p <= 1:
        raise ProtocolError(400, "parameter 'top_p' must be a number in (0, 1]")
    return {"max_new_tokens": tokens, "temperature": float(temperature), "top_p": float(top_p)}
