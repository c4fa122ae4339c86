"""Small plots as PNG files (PIL only: no plotting library needed for a loss curve)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

WIDTH, HEIGHT, MARGIN = 480, 280, 40


def loss_curve_png(losses: list[float], path: Path) -> Path:
    """Training loss per epoch as a line chart."""
    if not losses:
        raise ValueError("no losses to plot")
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    low, high = min(losses), max(losses)
    span = (high - low) or 1.0
    step = (WIDTH - 2 * MARGIN) / max(len(losses) - 1, 1)
    points = [
        (MARGIN + i * step, HEIGHT - MARGIN - (v - low) / span * (HEIGHT - 2 * MARGIN)) for i, v in enumerate(losses)
    ]
    draw.line([(MARGIN, MARGIN), (MARGIN, HEIGHT - MARGIN), (WIDTH - MARGIN, HEIGHT - MARGIN)], fill="black")
    if len(points) > 1:
        draw.line(points, fill="royalblue", width=2)
    for x, y in points:
        draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill="royalblue")
    draw.text((MARGIN, 10), f"training loss per epoch ({high:.4f} -> {losses[-1]:.4f})", fill="black")
    draw.text((WIDTH - MARGIN - 30, HEIGHT - MARGIN + 8), "epoch", fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


COLOURS = ("royalblue", "darkorange", "forestgreen", "crimson", "purple", "saddlebrown", "deeppink", "gray")
CHART_WIDTH, CHART_HEIGHT, LEGEND = 640, 300, 170


def lines_png(series: dict[str, list[tuple]], path: Path, title: str) -> Path:
    """A line chart of several series of (x, y) points, x numbers or datetimes, y from 0 up; points with a
    missing y (None or NaN) are left out. Written as a PNG, which the Dagster UI shows in Markdown (it
    strips inline SVG)."""
    points = {name: [(x, y) for x, y in values if y is not None and y == y] for name, values in series.items()}
    points = {name: values for name, values in points.items() if values}
    if not points:
        raise ValueError("no points to plot")
    xs = [_number(x) for values in points.values() for x, _ in values]
    low, span_x = min(xs), (max(xs) - min(xs)) or 1.0
    top = max(y for values in points.values() for _, y in values) or 1.0
    plot_width, plot_height = CHART_WIDTH - LEGEND - 2 * MARGIN, CHART_HEIGHT - 2 * MARGIN
    image = Image.new("RGB", (CHART_WIDTH, CHART_HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    left, bottom = MARGIN + 20, CHART_HEIGHT - MARGIN
    draw.line([(left, MARGIN), (left, bottom), (left + plot_width, bottom)], fill="black")
    draw.text((MARGIN, 10), title, fill="black")
    draw.text((4, MARGIN - 6), f"{top:.3g}", fill="black")
    draw.text((4, bottom - 6), "0", fill="black")
    first, last = (
        min(x for values in points.values() for x, _ in values),
        max(x for values in points.values() for x, _ in values),
    )
    draw.text((left, bottom + 6), _label(first), fill="black")
    draw.text((left + plot_width - 70, bottom + 6), _label(last), fill="black")
    for i, (name, values) in enumerate(sorted(points.items())):
        colour = COLOURS[i % len(COLOURS)]
        xy = [
            (left + (_number(x) - low) / span_x * plot_width, bottom - y / top * plot_height) for x, y in sorted(values)
        ]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for x, y in xy:
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=colour)
        draw.text((CHART_WIDTH - LEGEND + 10, MARGIN + 16 * i), name, fill=colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def _number(x) -> float:
    return x.timestamp() if hasattr(x, "timestamp") else float(x)


def _label(x) -> str:
    return x.strftime("%m-%d %H:%M") if hasattr(x, "strftime") else f"{x:g}"
