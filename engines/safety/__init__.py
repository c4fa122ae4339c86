"""Content safety: copy matching, the copy scorer, its calibration and its accuracy against ground truth."""
