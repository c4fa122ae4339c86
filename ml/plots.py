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
