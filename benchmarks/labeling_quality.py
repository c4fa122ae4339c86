"""Label quality per answer: a fixed three answers per item against adaptive answers (ask until the
Dawid-Skene posterior reaches the task's confidence, at most five), with a crowd of simulated annotators
of known accuracies (evenly spread over --low..--high) on the same items and gold questions, through the
label store's queue in process (simulator/crowd.py) on SQLite. Prints, per seed and as medians:
regular answers used, the model's label accuracy against the simulator's answer key, and how many
annotators' 95% gold-accuracy intervals hold their true accuracy.

    .venv/bin/python benchmarks/labeling_quality.py --items 600 --seeds 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ground_truth.db import connect  # noqa: E402
from ground_truth.schema import TaskSpec  # noqa: E402
from simulator.crowd import CrowdRound, add_annotators, crowd, run_round  # noqa: E402

LABELS = ["violation", "ok"]


def specs(confidence: float, gold_share: float) -> dict[str, TaskSpec]:
    common = {"question": "Is this a copy?", "labels": LABELS, "gold_share": gold_share, "confidence": confidence}
    return {
        "fixed3": TaskSpec(name="fixed3", annotators_per_item=3, **common),
        "adaptive": TaskSpec(name="adaptive", adaptive=True, max_answers=5, **common),
    }


def one_seed(args, seed: int) -> dict[str, CrowdRound]:
    rng = random.Random(seed)
    truth = {str(i): "violation" if rng.random() < args.prevalence else "ok" for i in range(args.items)}
    gold = {f"gold{i}": "violation" if rng.random() < args.prevalence else "ok" for i in range(args.gold)}
    accuracy = crowd(args.annotators, args.low, args.high)
    with tempfile.TemporaryDirectory(prefix="labeling-quality-") as folder:
        engine = connect(f"sqlite:///{folder}/labels.db")
        ids = add_annotators(engine, accuracy)
        found = {
            name: run_round(engine, spec, truth, gold, ids, accuracy, seed)
            for name, spec in specs(args.confidence, args.gold_share).items()
        }
        engine.dispose()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--gold", type=int, default=100, help="seeded gold questions")
    parser.add_argument("--gold-share", type=float, default=0.1)
    parser.add_argument("--annotators", type=int, default=20)
    parser.add_argument("--low", type=float, default=0.7, help="lowest annotator accuracy")
    parser.add_argument("--high", type=float, default=0.95, help="highest annotator accuracy")
    parser.add_argument("--prevalence", type=float, default=0.3, help="share of items whose true label is violation")
    parser.add_argument("--confidence", type=float, default=0.85, help="the adaptive task's stopping posterior")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    rounds = [one_seed(args, seed) for seed in range(args.seeds)]
    print(f"{'seed':>4} {'policy':>9} {'answers':>8} {'accuracy':>9} {'covered':>8} {'alpha':>7}")
    for seed, found in enumerate(rounds):
        for name, r in found.items():
            alpha = r.quality.krippendorff_alpha
            covered = f"{r.covered}/{r.scored}"
            print(f"{seed:>4} {name:>9} {r.answers:>8} {r.label_accuracy:>9.4f} {covered:>8} {alpha:>7.3f}")
    median = {
        name: {
            "answers": statistics.median(f[name].answers for f in rounds),
            "accuracy": statistics.median(f[name].label_accuracy for f in rounds),
            "coverage": statistics.median(f[name].covered / f[name].scored for f in rounds),
        }
        for name in rounds[0]
    }
    for name, m in median.items():
        print(f"median {name}: answers {m['answers']:.0f}, label accuracy {m['accuracy']:.4f}", end="")
        print(f", gold intervals holding the true accuracy {m['coverage']:.0%}")
    fewer = 1 - median["adaptive"]["answers"] / median["fixed3"]["answers"]
    gap = median["adaptive"]["accuracy"] - median["fixed3"]["accuracy"]
    print(f"adaptive: {fewer:.1%} fewer answers than fixed-3, label accuracy {gap:+.4f}")


if __name__ == "__main__":
    main()
