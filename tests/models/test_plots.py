"""ml.plots.lines_png: the CTR-over-time picture of monitoring/online_accuracy (a PNG, which the Dagster
UI shows in Markdown where it strips inline SVG)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from PIL import Image, ImageColor

from ml.plots import CHART_HEIGHT, CHART_WIDTH, COLOURS, lines_png

T0 = datetime(2026, 3, 2, 8, tzinfo=UTC)


def colour_count(image: Image.Image, name: str) -> int:
    counts = {colour: n for n, colour in image.getcolors(maxcolors=CHART_WIDTH * CHART_HEIGHT)}
    return counts.get(ImageColor.getrgb(name), 0)


def test_each_series_is_drawn_in_its_colour_and_missing_points_are_left_out(tmp_path):
    series = {
        "live control": [(T0 + timedelta(hours=h), 0.1 + 0.01 * h) for h in range(6)],
        "live treatment": [(T0 + timedelta(hours=h), v) for h, v in enumerate([0.12, math.nan, None, 0.15, 0.2, 0.1])],
    }
    path = lines_png(series, tmp_path / "out" / "ctr.png", "CTR@10 per hour")
    image = Image.open(path)
    assert image.format == "PNG" and image.size == (CHART_WIDTH, CHART_HEIGHT)
    rgb = image.convert("RGB")
    assert colour_count(rgb, COLOURS[0]) > 50 and colour_count(rgb, COLOURS[1]) > 50  # sorted by name
    assert colour_count(rgb, COLOURS[2]) == 0


def test_nothing_to_plot_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no points"):
        lines_png({"live control": [(T0, math.nan), (T0, None)]}, tmp_path / "x.png", "empty")
    assert not (tmp_path / "x.png").exists()
