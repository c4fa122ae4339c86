"""Synthetic item thumbnails.

The silhouette depends on the category, the fill colour on the title's colour word and the
texture on its material word, so an image-text model can learn the link. Violating variants are
near-copies of their reference's image.
"""

import io

import numpy as np
from PIL import Image, ImageDraw

from .vocabulary import COLOURS


def _rect(x0, y0, x1, y1):
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _ellipse(cx, cy, rx, ry, n=24):
    a = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return list(zip(cx + rx * np.cos(a), cy + ry * np.sin(a)))


# Silhouettes in [-1, 1] coordinates (y down) as (polygon, fill); fill 0 cuts a hole.
SHAPES = {
    "vehicle": [
        (_rect(-0.9, -0.1, 0.9, 0.35), 255),
        (_rect(-0.45, -0.5, 0.4, -0.1), 255),
        (_ellipse(-0.5, 0.4, 0.22, 0.22), 255),
        (_ellipse(0.5, 0.4, 0.22, 0.22), 255),
    ],
    "weapon": [
        ([(-0.1, -0.7), (0.0, -0.98), (0.1, -0.7), (0.1, 0.45), (-0.1, 0.45)], 255),
        (_rect(-0.45, 0.45, 0.45, 0.58), 255),
        (_rect(-0.07, 0.58, 0.07, 0.95), 255),
    ],
    "pet": [
        (_ellipse(0.15, 0.25, 0.6, 0.35), 255),
        (_ellipse(-0.55, -0.25, 0.32, 0.3), 255),
        ([(-0.85, -0.4), (-0.8, -0.85), (-0.6, -0.5)], 255),
        ([(-0.5, -0.5), (-0.3, -0.85), (-0.25, -0.4)], 255),
        (_rect(-0.25, 0.45, -0.1, 0.85), 255),
        (_rect(0.4, 0.45, 0.55, 0.85), 255),
    ],
    "furniture": [
        (_rect(-0.55, -0.05, 0.55, 0.15), 255),
        (_rect(0.38, -0.85, 0.55, 0.15), 255),
        (_rect(-0.55, 0.15, -0.4, 0.85), 255),
        (_rect(0.4, 0.15, 0.55, 0.85), 255),
    ],
    "building": [
        (_rect(-0.7, -0.1, 0.7, 0.85), 255),
        ([(-0.9, -0.1), (0.0, -0.9), (0.9, -0.1)], 255),
        (_rect(-0.15, 0.4, 0.15, 0.85), 0),
    ],
    "character": [
        (_ellipse(0.0, -0.68, 0.22, 0.22), 255),
        (_rect(-0.25, -0.42, 0.25, 0.3), 255),
        (_rect(-0.55, -0.42, -0.3, 0.2), 255),
        (_rect(0.3, -0.42, 0.55, 0.2), 255),
        (_rect(-0.23, 0.3, -0.05, 0.92), 255),
        (_rect(0.05, 0.3, 0.23, 0.92), 255),
    ],
    "plant": [(_rect(-0.1, 0.1, 0.1, 0.92), 255), (_ellipse(0.0, -0.3, 0.62, 0.52), 255)],
    "accessory": [
        (_ellipse(0.0, 0.1, 0.72, 0.72), 255),
        (_ellipse(0.0, 0.1, 0.42, 0.42), 0),
        (_ellipse(0.0, -0.72, 0.18, 0.18), 255),
    ],
    "food": [
        (_ellipse(0.0, -0.25, 0.75, 0.4), 255),
        (_rect(-0.8, -0.05, 0.8, 0.15), 255),
        (_ellipse(0.0, 0.35, 0.72, 0.2), 255),
    ],
    "hat": [(_rect(-0.42, -0.85, 0.42, 0.3), 255), (_ellipse(0.0, 0.35, 0.9, 0.16), 255)],
}


def _shade(rgb: np.ndarray) -> np.ndarray:
    """A contrasting shade of the same colour for stripes, dots and checks."""
    return rgb * 0.45 if rgb.mean() > 80 else rgb + 110


def _texture(material: str, rgb: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size]
    phase = rng.integers(0, 8)
    if material == "striped":
        pattern = ((x + y + phase) // 4) % 2 == 1
    elif material == "dotted":
        pattern = ((x + phase) % 10 - 5) ** 2 + ((y + phase) % 10 - 5) ** 2 <= 6
    elif material == "checkered":
        pattern = ((x + phase) // 8 + (y + phase) // 8) % 2 == 1
    else:  # plain: flat colour with a soft vertical gradient
        light = 1.0 + 0.15 * (0.5 - y / size)
        return np.clip(rgb * light[..., None], 0, 255)
    return np.where(pattern[..., None], _shade(rgb), rgb)


def render(category: str, colour: str, material: str, seed: int, size: int = 64) -> np.ndarray:
    """An RGB uint8 image (size x size x 3) of one item; `seed` drives the random jitter."""
    rng = np.random.default_rng(seed)
    scale = size * 0.42 * rng.uniform(0.8, 1.0)
    angle = np.deg2rad(rng.uniform(-15, 15))
    centre = size / 2 + rng.uniform(-4, 4, 2) * size / 64
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])

    mask = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    for polygon, fill in SHAPES[category]:
        points = np.asarray(polygon) @ rot.T * scale + centre
        draw.polygon([tuple(p) for p in points], fill=fill)
    inside = np.asarray(mask)[..., None] > 0

    rgb = np.clip(np.asarray(COLOURS[colour], dtype=float) + rng.uniform(-15, 15, 3), 0, 255)
    background = np.array([200.0, 205.0, 212.0]) + rng.uniform(-10, 10, 3)
    image = np.where(inside, _texture(material, rgb, size, rng), background)
    image = image + rng.normal(0, 5, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def perturb(image: np.ndarray, seed: int) -> np.ndarray:
    """A near-copy of `image`: small shift, tint and noise (how a copied design is disguised)."""
    rng = np.random.default_rng(seed)
    shifted = np.roll(image, shift=tuple(rng.integers(-1, 2, 2)), axis=(0, 1)).astype(float)
    tinted = shifted * (1 + rng.uniform(-0.05, 0.05, 3)) + rng.normal(0, 4, image.shape)
    return np.clip(tinted, 0, 255).astype(np.uint8)


def to_png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()
