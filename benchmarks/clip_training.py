"""One training step of the compact CLIP model (forward, ClipLoss, backward, optimizer step) on one CPU
thread, as a Ray Train worker of the demo runs it: with torch's default AdamW (the training loop's until
2026-12-05; on a CPU it updates tensor by tensor) and with mlplane's (`ml.clip.clip_optimizer`: fused), alternating
step by step on the same random batch, --repeats steps each after two warm-up steps. Figures are the median and
P99 per step and the ratio.

    .venv/bin/python benchmarks/clip_training.py --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from ml.clip import ClipSpec, TrainConfig, clip_optimizer, image_size, import_open_clip, load_model  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Trainer:
    """One model with its optimizer, stepped on the same batch."""

    def __init__(self, make_optimizer):
        torch.manual_seed(0)
        self.model = load_model(ClipSpec()).train()
        self.optimizer = make_optimizer(self.model)
        self.loss_fn = import_open_clip().ClipLoss()

    def step(self, batch: tuple) -> float:
        started = time.perf_counter()
        image_features, text_features, logit_scale = self.model(*batch)[:3]
        loss = self.loss_fn(image_features, text_features, logit_scale)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = TrainConfig()
    spec = ClipSpec()
    size = image_size(load_model(spec))
    text = import_open_clip().get_model_config(spec.model_name)["text_cfg"]
    tokens = torch.randint(0, text["vocab_size"], (config.batch_size, text["context_length"]))
    batch = (torch.randn(config.batch_size, 3, size, size), tokens)
    optimizers = {
        "torch's default AdamW": lambda m: torch.optim.AdamW(
            m.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
        ),
        "mlplane (fused AdamW)": lambda m: clip_optimizer(m, config, "cpu"),
    }
    trainers = {name: Trainer(make) for name, make in optimizers.items()}
    results: dict[str, list[float]] = {name: [] for name in trainers}
    for n in range(args.repeats + 2):  # alternating, so the machine's drift falls on both
        for name in list(trainers)[:: 1 if n % 2 else -1]:
            took = trainers[name].step(batch)
            if n >= 2:
                results[name].append(took)
    print(f"{'optimizer':>24} {'median ms':>10} {'P99 ms':>8}  (one step, batch {config.batch_size}, one thread)")
    for name, values in results.items():
        print(f"{name:>24} {statistics.median(values):>10.1f} {percentile(values, 0.99):>8.1f}")
    peer, ours = (statistics.median(v) for v in results.values())
    print(f"{'default / ours':>24} {peer / ours:>10.2f}x")


if __name__ == "__main__":
    main()
