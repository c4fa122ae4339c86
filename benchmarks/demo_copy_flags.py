"""The copy flags a demo wrote, against the simulator's answer key: precision and recall of the flags in
the lake (the product's CLIP, matching, copy model and threshold, after the demo's labeling round and
release), and whether the platform's own cross-validated intervals (the registry's `copy_detector`
version, as the flags asset registered it) contain those figures. Only this script reads the answer key
(`<lake>/sim_truth`); the product never does.

Every item of every flags partition counts: the demo flags all its days again after the release, so each
item is scored by the calibration fitted on it. Intervals here are Wilson 95% over the lake's items.

    .venv/bin/mlplane demo && .venv/bin/python benchmarks/demo_copy_flags.py --data-dir data
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def interval(successes: int, trials: int) -> str:
    from ground_truth.agreement import wilson_interval

    bounds = wilson_interval(successes, trials)
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else "[-]"


def flags_and_truth(lake: Path) -> pl.DataFrame:
    """Each flagged-partition item's newest flag beside the answer key's verdict."""
    flags = pl.read_parquet(lake / "content_violations" / "flags" / "*" / "part-0.parquet", include_file_paths="path")
    newest = flags.sort("path").unique("item_id", keep="last").select("item_id", "flagged", "original_id")
    truth = pl.read_parquet(lake / "sim_truth" / "items" / "**" / "*.parquet").unique("item_id", keep="last")
    return newest.join(truth.select("item_id", "is_violation", "reference_item_id"), on="item_id", how="left")


def platform_estimates(lake: Path) -> dict[str, float] | None:
    """The newest copy_detector version's cross-validated precision and recall with their intervals."""
    from engines.models.registry import ModelRegistry
    from engines.safety.copy_registry import newest_calibration

    with tempfile.TemporaryDirectory() as work:
        newest = newest_calibration(ModelRegistry.local(lake / "registry"), Path(work))
    return None if newest is None else newest[1].metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="data", help="a demo's lake")
    lake = Path(parser.parse_args().data_dir)
    scored = flags_and_truth(lake)
    unknown = scored["is_violation"].null_count()
    if unknown:
        raise SystemExit(f"{unknown} flagged-partition items are not in the answer key: not a simulated lake?")
    flagged, violation = scored["flagged"].to_numpy(), scored["is_violation"].to_numpy()
    tp = int((flagged & violation).sum())
    precision, recall = tp / max(flagged.sum(), 1), tp / max(violation.sum(), 1)
    matched = scored.filter("flagged" & pl.col("is_violation"))
    right_original = int((matched["original_id"] == matched["reference_item_id"]).sum())
    copies, flags = int(violation.sum()), int(flagged.sum())
    print(f"{lake}: {scored.height} items in the flags, {copies} copies (answer key), {flags} flagged")
    print(
        f"answer key: precision {precision:.3f} {interval(tp, flags)}, recall {recall:.3f} {interval(tp, copies)}; "
        f"flagged copies naming their original {right_original}/{tp}"
    )
    estimates = platform_estimates(lake)
    if estimates is None:
        print("platform: no copy_detector version in the registry (no release yet)")
        return
    for name, truth in (("precision", precision), ("recall", recall)):
        low, value, high = (estimates.get(f"cv_{name}{s}") for s in ("_low", "", "_high"))
        inside = low is not None and high is not None and low <= truth <= high
        print(f"platform cv_{name} {value} [{low}, {high}]: contains the answer key's {truth:.3f}: {inside}")


if __name__ == "__main__":
    main()
