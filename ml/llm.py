"""The platform's own small language model: a byte-level BPE tokenizer and a tiny Llama-architecture
causal LM trained on the marketplace's text (chat messages, item titles and descriptions), saved in
Hugging Face format so that vLLM (or any Llama-compatible server) serves it. Attention heads are 64
wide because vLLM's CPU attention rejects smaller heads."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class LlmConfig:
    vocab_size: int = 1024
    hidden_size: int = 128
    layers: int = 2
    heads: int = 2  # head size = hidden_size / heads = 64
    intermediate_size: int = 344
    context: int = 128
    steps: int = 200
    batch_size: int = 16
    learning_rate: float = 3e-3
    seed: int = 0
    threads: int = 2

    def __post_init__(self):
        if self.hidden_size // self.heads != 64 or self.hidden_size % self.heads:
            raise ValueError(f"head size must be 64 (hidden_size / heads), got {self.hidden_size}/{self.heads}")


def corpus_from_frames(chat_texts: list[str], titles: list[str], descriptions: Sequence[str] = ()) -> list[str]:
    """Training documents: every chat message, and an item listing per title (with its description)."""
    documents = [t for t in chat_texts if t]
    for i, title in enumerate(titles):
        description = descriptions[i] if i < len(descriptions) else ""
        documents.append(f"{title}. {description}".strip())
    if not documents:
        raise ValueError("no text to train the language model on: the chat and item tables are empty")
    return documents


def train_tokenizer(documents: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (any text encodes, nothing maps to unknown) with chat role tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# The draft model for speculative decoding: one layer, half the width, the target's tokenizer.
DRAFT_CONFIG = LlmConfig(hidden_size=64, layers=1, heads=1, intermediate_size=172)


def train_llm(
    documents: list[str],
    out_dir: str | Path,
    config: LlmConfig = LlmConfig(),
    log=print,
    tokenizer_dir: str | Path | None = None,
) -> dict:
    """Train tokenizer and model, save both to `out_dir` (Hugging Face format); returns metrics. With
    `tokenizer_dir`, the tokenizer saved there is reused (a draft model must share its target's)."""
    import torch
    from transformers import PreTrainedTokenizerFast

    started = time.perf_counter()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    if tokenizer_dir is not None:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    else:
        tokenizer = train_tokenizer(documents, config.vocab_size)
    train, held_out = _token_streams(documents, tokenizer, config)
    model = _new_model(tokenizer, config)
    losses, eval_loss = _fit(model, train, held_out, config, log)
    out = _save(model, tokenizer, Path(out_dir), config, tokenizer_dir)
    metrics = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "train_tokens": len(train),
        "documents": len(documents),
        "final_train_loss": sum(losses[-10:]) / len(losses[-10:]),
        "held_out_loss": eval_loss,
        "held_out_perplexity": math.exp(eval_loss),
        "unigram_perplexity": _unigram_perplexity(train, held_out if len(held_out) else train),
        "train_seconds": time.perf_counter() - started,
        "tokenizer_sha256": tokenizer_sha256(out),
        "config": asdict(config),
    }
    (out / "mlplane_training.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def _token_streams(documents: list[str], tokenizer, config: LlmConfig):
    """The corpus as one token stream (each document between BOS and EOS), split 95/5 into train and held out."""
    import torch

    ids: list[int] = []
    for document in documents:
        ids.extend(
            [tokenizer.bos_token_id, *tokenizer.encode(document, add_special_tokens=False), tokenizer.eos_token_id]
        )
    if len(ids) < 4 * config.context:
        raise ValueError(f"corpus of {len(ids)} tokens is too small for context {config.context}")
    stream = torch.tensor(ids, dtype=torch.long)
    split = int(len(stream) * 0.95)
    return stream[:split], stream[split:]


def _new_model(tokenizer, config: LlmConfig):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.layers,
            num_attention_heads=config.heads,
            num_key_value_heads=config.heads,
            head_dim=config.hidden_size // config.heads,
            max_position_embeddings=config.context * 4,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
        )
    )


def _fit(model, train, held_out, config: LlmConfig, log) -> tuple[list[float], float]:
    """`config.steps` AdamW steps on random windows of `train`; the per-step losses and a held-out loss."""
    import torch

    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, config.learning_rate, total_steps=config.steps, pct_start=0.1
    )

    def batch(source):
        starts = [rng.randrange(0, len(source) - config.context - 1) for _ in range(config.batch_size)]
        return torch.stack([source[s : s + config.context] for s in starts])

    model.train()
    losses = []
    for step in range(config.steps):
        tokens = batch(train)
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == config.steps - 1:
            log(f"step {step}: loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        source = held_out if len(held_out) > config.context + 1 else train
        eval_loss = sum(model(input_ids=(t := batch(source)), labels=t).loss.item() for _ in range(4)) / 4
    return losses, eval_loss


def _save(model, tokenizer, out: Path, config: LlmConfig, tokenizer_dir: str | Path | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.max_length = config.context * 4
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if tokenizer_dir is not None:  # byte-identical tokenizer files, so the hashes prove the match
        for file in Path(tokenizer_dir).iterdir():
            if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copy2(file, out / file.name)
    return out


def tokenizer_sha256(model_dir: str | Path) -> str:
    """The identity of a tokenizer: the hash of its tokenizer.json (a draft model and its target must match)."""
    import hashlib

    return hashlib.sha256((Path(model_dir) / "tokenizer.json").read_bytes()).hexdigest()


def _unigram_perplexity(train, held_out) -> float:
    """Baseline: perplexity of token frequencies alone (a model that learned anything beats it)."""
    import torch

    counts = torch.bincount(train, minlength=int(max(train.max(), held_out.max())) + 1).double() + 1
    probabilities = counts / counts.sum()
    return math.exp(-probabilities[held_out].log().mean().item())
