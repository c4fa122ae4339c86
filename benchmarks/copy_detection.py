"""Copy detection on the demo's catalogue against the simulator's answer key: the copy model against the
single similarity cut, each fitted on the same simulated releases, and whether the platform's own
cross-validated intervals contain the answer key's figures.

The catalogue is the simulator's world at the end of --days days (the demo's size by default), its
thumbnails drawn as the simulator draws them (copies disguised by its `perturb`). The candidate stage
uses a stand-in for CLIP (8 x 8 colour blocks: what the image shows, coarsely), so no model is trained;
verification, features, model and calibration are the product's (`engines.safety.copy_match`,
`copy_model`, `copy_calibration`). Each release labels what the queues would: --audit random items
and the items users report (copies with probability --report-copy, other items --report-other),
with the answer key's labels (perfect annotators). Precision and recall are measured on every item
with an earlier item of another creator to match; intervals are Wilson 95% over those items, and the
spread over releases is given as the range.

    .venv/bin/python benchmarks/copy_detection.py                  # 4 days, 10 releases
    .venv/bin/python benchmarks/copy_detection.py --releases 3 --scale 0.25
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def catalogue(days: int, scale: float):
    """(items: item_id, creator_id, created_at, image_embedding; pixels; is_violation)."""
    from simulator import thumbnails
    from simulator.config import SimulatorConfig
    from simulator.world import World

    config = SimulatorConfig().scaled(scale) if scale != 1 else SimulatorConfig()
    items = World(config).at(days - 1)[0].items
    pixels = {}
    for row in items.itertuples():
        image = thumbnails.render(row.category, row.colour, row.material, row.render_seed, config.thumbnail_size)
        if row.perturb_seed >= 0:
            image = thumbnails.perturb(image, row.perturb_seed)
        pixels[int(row.item_id)] = image.astype(np.float32)
    ids = list(pixels)
    frame = pl.DataFrame(
        {
            "item_id": ids,
            "creator_id": items.creator_id.to_numpy(),
            "created_at": pl.Series(items.created_at.to_numpy()).cast(pl.Datetime("us")),
            "image_embedding": [stand_in_embedding(pixels[i]).tolist() for i in ids],
        },
        schema_overrides={"image_embedding": pl.List(pl.Float32)},
    )
    return frame, pixels, items.is_violation.to_numpy()


def stand_in_embedding(image: np.ndarray) -> np.ndarray:
    size = image.shape[0] // 8
    blocks = image.reshape(8, size, 8, size, 3).mean(axis=(1, 3)).ravel()
    blocks = blocks - blocks.mean()
    return blocks / np.linalg.norm(blocks)


def wilson(successes: int, trials: int) -> str:
    from engines.safety.violation_accuracy import Rate

    rate = Rate(successes, trials)
    if not trials:
        return "n/a"
    low, high = rate.interval
    return f"{rate.value:.3f} [{low:.3f}, {high:.3f}]"


def counts(flagged: np.ndarray, truth: np.ndarray) -> tuple[int, int, int]:
    return int((flagged & truth).sum()), int(flagged.sum()), int(truth.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--releases", type=int, default=10)
    parser.add_argument("--audit", type=int, default=80, help="random audit items per release (20 a day)")
    parser.add_argument("--report-copy", type=float, default=0.3)
    parser.add_argument("--report-other", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from engines.safety.copy_calibration import best_threshold, calibrate
    from engines.safety.copy_match import match_originals
    from engines.safety.copy_model import copy_features

    started = time.perf_counter()
    items, pixels, is_violation = catalogue(args.days, args.scale)
    matches = match_originals(items, items, pixels)
    truth = dict(zip(items["item_id"].to_list(), is_violation.tolist(), strict=True))
    positive = np.array([truth[i] for i in matches["item_id"].to_list()])
    features, matched = copy_features(matches)
    similarity = matches["similarity"].fill_null(-np.inf).to_numpy()
    print(
        f"{len(items)} items, {int(positive.sum())} copies, {int(matched.sum())} with an earlier item of another "
        f"creator; matched in {time.perf_counter() - started:.0f} s"
    )
    rng = np.random.default_rng(args.seed)
    results = {"model": [], "cut": []}
    covered = {"precision": 0, "recall": 0}
    for release in range(args.releases):
        audit = np.zeros(len(positive), dtype=bool)
        audit[rng.choice(len(positive), args.audit, replace=False)] = True
        labelled = audit | (rng.random(len(positive)) < np.where(positive, args.report_copy, args.report_other))
        calibration = calibrate(
            features[labelled], matched[labelled], positive[labelled], audit[labelled], f"sim{release}"
        )
        flagged = matched & (calibration.model.score(features) >= calibration.threshold)
        cut = similarity >= best_threshold(similarity[labelled], positive[labelled])
        on = matched
        results["model"].append(counts(flagged[on], positive[on]))
        results["cut"].append(counts(cut[on], positive[on]))
        hits, flags, copies = results["model"][-1]
        true_precision, true_recall = hits / max(flags, 1), hits / copies
        covered["precision"] += calibration.precision.low <= true_precision <= calibration.precision.high
        covered["recall"] += calibration.recall.low <= true_recall <= calibration.recall.high
        print(
            f"release {release}: {int(labelled.sum())} labelled ({int(positive[labelled].sum())} copies); model "
            f"P {wilson(hits, flags)} R {wilson(hits, copies)} (platform's CV: P {calibration.precision.value:.3f} "
            f"[{calibration.precision.low:.3f}, {calibration.precision.high:.3f}], R {calibration.recall.value:.3f} "
            f"[{calibration.recall.low:.3f}, {calibration.recall.high:.3f}]); cut "
            f"P {wilson(*results['cut'][-1][:2])} R {wilson(results['cut'][-1][0], copies)}"
        )
    print("| detector | flagged (mean) | precision mean [range] | recall mean [range] |")
    print("|---|---|---|---|")
    for name, rows in results.items():
        rows = np.array(rows, dtype=float)
        precision, recall = rows[:, 0] / np.maximum(rows[:, 1], 1), rows[:, 0] / rows[:, 2]
        print(
            f"| {name} | {rows[:, 1].mean():.1f} | {precision.mean():.3f} [{precision.min():.3f}, "
            f"{precision.max():.3f}] | {recall.mean():.3f} [{recall.min():.3f}, {recall.max():.3f}] |"
        )
    print(
        f"platform's intervals contained the answer key's precision in {covered['precision']}/{args.releases} "
        f"releases, recall in {covered['recall']}/{args.releases}; {time.perf_counter() - started:.0f} s in all"
    )


if __name__ == "__main__":
    main()
