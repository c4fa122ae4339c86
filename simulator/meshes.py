"""Procedural item meshes: a few boxes and n-sided prisms per category, scaled to the item's size.

Parts of one mesh never touch (their bounding boxes are disjoint), so the mesh is a union of closed
components: watertight, and its volume, area, vertex and face counts are the sums of its parts'
analytic values (`MeshSpec.truth`), which the answer key in sim_truth/ holds and tests compare the
geometry job with. A share of meshes is broken the ways upstream files break (`DEFECTS`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

DEFECTS = ("non_manifold", "degenerate_faces", "empty", "unreadable")
DEFECT_SHARE = 0.01  # of new items, per kind of defect

# Parts in unit coordinates (the item's bounding box is [-0.5, 0.5]^3, z up): (kind, centre, size,
# prism axis). Sizes only shrink when jittered, so parts that are disjoint here stay disjoint.
Part = tuple[str, tuple[float, float, float], tuple[float, float, float], str]
TEMPLATES: dict[str, tuple[Part, ...]] = {
    "vehicle": (
        ("box", (0, 0, -0.1), (1.0, 0.8, 0.4), ""),
        ("box", (-0.05, 0, 0.3), (0.5, 0.7, 0.38), ""),
        *(("prism", (x, y, -0.38), (0.22, 0.09, 0.22), "y") for x in (-0.3, 0.3) for y in (-0.455, 0.455)),
    ),
    "weapon": (
        ("box", (0.15, 0, 0), (0.7, 0.4, 0.3), ""),
        ("box", (-0.25, 0, 0), (0.08, 1.0, 1.0), ""),
        ("prism", (-0.4, 0, 0), (0.18, 0.5, 0.5), "x"),
    ),
    "pet": (
        ("prism", (0.1, 0, -0.05), (0.6, 0.7, 0.5), "x"),
        ("box", (-0.35, 0, 0.2), (0.28, 0.5, 0.5), ""),
        *(("box", (x, y, -0.4), (0.1, 0.12, 0.18), "") for x in (0.0, 0.3) for y in (-0.2, 0.2)),
        ("box", (0.45, 0, 0.1), (0.08, 0.1, 0.3), ""),
    ),
    "furniture": (
        ("box", (0, 0, 0), (0.9, 0.9, 0.1), ""),
        ("box", (0.4, 0, 0.28), (0.1, 0.9, 0.42), ""),
        *(("box", (x, y, -0.28), (0.1, 0.1, 0.42), "") for x in (-0.38, 0.38) for y in (-0.38, 0.38)),
    ),
    "building": (
        ("box", (0, 0, -0.2), (1.0, 1.0, 0.6), ""),
        ("prism", (0, 0, 0.3), (0.7, 0.7, 0.38), "z"),
        ("box", (0.4, 0.4, 0.3), (0.08, 0.08, 0.3), ""),
    ),
    "character": (
        ("box", (0, 0, 0.05), (0.5, 0.6, 0.4), ""),
        ("prism", (0, 0, 0.38), (0.4, 0.5, 0.22), "z"),
        *(("box", (x, 0, 0.05), (0.15, 0.5, 0.35), "") for x in (-0.4, 0.4)),
        *(("box", (x, 0, -0.33), (0.18, 0.5, 0.32), "") for x in (-0.12, 0.12)),
    ),
    "plant": (("prism", (0, 0, -0.25), (0.2, 0.2, 0.48), "z"), ("prism", (0, 0, 0.25), (1.0, 1.0, 0.48), "z")),
    "accessory": (("prism", (0, 0, 0), (1.0, 1.0, 0.6), "z"), ("box", (0, 0, 0.4), (0.2, 0.2, 0.18), "")),
    "food": (
        ("prism", (0, 0, -0.35), (1.0, 1.0, 0.28), "z"),
        ("prism", (0, 0, -0.05), (0.95, 0.95, 0.28), "z"),
        ("prism", (0, 0, 0.3), (1.0, 1.0, 0.38), "z"),
    ),
    "hat": (("prism", (0, 0, 0.15), (0.7, 0.7, 0.68), "z"), ("prism", (0, 0, -0.35), (1.0, 1.0, 0.28), "z")),
}
_UNIT_BOX = np.array([[x, y, z] for x in (-0.5, 0.5) for y in (-0.5, 0.5) for z in (-0.5, 0.5)])
_BOX_FACES = np.array(
    [
        [0, 1, 3],
        [0, 3, 2],
        [4, 6, 7],
        [4, 7, 5],
        [0, 4, 5],
        [0, 5, 1],
        [2, 3, 7],
        [2, 7, 6],
        [0, 2, 6],
        [0, 6, 4],
        [1, 5, 7],
        [1, 7, 3],
    ]
)
# A prism is built along z, then its axes rotated (cyclic permutations keep the faces outward).
_AXIS_ORDER = {"z": (0, 1, 2), "x": (1, 2, 0), "y": (2, 0, 1)}


def mesh_file_name(item_id: int) -> str:
    """Upstream delivers most meshes as glTF binary, every fourth as OBJ."""
    return f"meshes/{item_id}.{'obj' if item_id % 4 == 0 else 'glb'}"


def sections_for(median_vertices: float) -> int:
    """Sides of the item's prisms: more detailed categories (and items) get rounder parts."""
    return int(np.clip(round(median_vertices / 250), 4, 64))


def mesh_vertex_count(categories, sections) -> list[int]:
    """Vertices of each item's mesh: 8 per box, 2n + 2 per n-sided prism."""
    return [
        sum(8 if kind == "box" else 2 * int(n) + 2 for kind, *_ in TEMPLATES[c]) for c, n in zip(categories, sections)
    ]


@dataclass(frozen=True)
class MeshTruth:
    vertex_count: int
    face_count: int
    surface_area: float
    volume: float
    bbox: tuple[float, float, float]


@dataclass(frozen=True)
class MeshSpec:
    """One item's mesh: parts as (kind, centre, size in metres, prism axis) and the prisms' sides."""

    parts: tuple[tuple[str, np.ndarray, np.ndarray, str], ...]
    sections: int

    def build(self) -> tuple[np.ndarray, np.ndarray]:
        vertices, faces, offset = [], [], 0
        for kind, centre, size, axis in self.parts:
            if kind == "box":
                v, f = _UNIT_BOX * size + centre, _BOX_FACES
            else:
                order = _AXIS_ORDER[axis]
                unit_v, f = _unit_prism(self.sections)
                v = np.empty_like(unit_v)
                v[:, order] = unit_v  # the prism's z becomes `axis`
                v = v * size + centre
            vertices.append(v)
            faces.append(f + offset)
            offset += len(v)
        return np.vstack(vertices), np.vstack(faces)

    def truth(self) -> MeshTruth:
        """Counts, area and volume from the parts' formulas (not from the triangles)."""
        vertices = faces = 0
        area = volume = 0.0
        for kind, _, size, axis in self.parts:
            if kind == "box":
                x, y, z = size
                vertices, faces = vertices + 8, faces + 12
                area += 2 * (x * y + y * z + x * z)
                volume += x * y * z
                continue
            order = _AXIS_ORDER[axis]
            a, b, h = size[order[0]] / 2, size[order[1]] / 2, size[order[2]]
            n = self.sections
            angles = 2 * np.pi * np.arange(n + 1) / n
            ring = np.stack([a * np.cos(angles), b * np.sin(angles)], axis=1)
            polygon = 0.5 * n * a * b * np.sin(2 * np.pi / n)
            perimeter = float(np.linalg.norm(np.diff(ring, axis=0), axis=1).sum())
            vertices, faces = vertices + 2 * n + 2, faces + 4 * n
            area += 2 * polygon + perimeter * h
            volume += polygon * h
        points, _ = self.build()
        extent = points.max(axis=0) - points.min(axis=0)
        return MeshTruth(vertices, faces, area, volume, (float(extent[0]), float(extent[1]), float(extent[2])))


def _unit_prism(n: int) -> tuple[np.ndarray, np.ndarray]:
    """An n-sided prism in the unit box: rings at z=-0.5 and 0.5 (n each), then the two cap centres."""
    angles = 2 * np.pi * np.arange(n) / n
    ring = np.stack([0.5 * np.cos(angles), 0.5 * np.sin(angles)], axis=1)
    vertices = np.vstack(
        [
            np.column_stack([ring, np.full(n, -0.5)]),
            np.column_stack([ring, np.full(n, 0.5)]),
            [[0, 0, -0.5], [0, 0, 0.5]],
        ]
    )
    k, nxt = np.arange(n), (np.arange(n) + 1) % n
    bottom = np.column_stack([np.full(n, 2 * n), nxt, k])
    top = np.column_stack([np.full(n, 2 * n + 1), n + k, n + nxt])
    sides = np.vstack([np.column_stack([k, nxt, n + nxt]), np.column_stack([k, n + nxt, n + k])])
    return vertices, np.vstack([bottom, top, sides])


def mesh_spec(category: str, bbox: tuple[float, float, float], sections: int, seed: int, fill: float) -> MeshSpec:
    """The item's parts: its category's template, each part shrunk by its own random factor (at
    most `fill`), scaled to `bbox`. Unequal shrinking makes the shapes less than perfectly symmetric."""
    rng = np.random.default_rng(seed)
    scale = np.asarray(bbox, dtype=float)
    parts = []
    for kind, centre, size, axis in TEMPLATES[category]:
        shrink = fill * rng.uniform(0.85, 1.0, 3)
        parts.append((kind, np.asarray(centre, float) * scale, np.asarray(size, float) * shrink * scale, axis))
    return MeshSpec(tuple(parts), sections)


def broken_file(defect: str, vertices: np.ndarray, faces: np.ndarray, fmt: str) -> bytes:
    """The mesh file of a broken item: `defect` is one of DEFECTS."""
    if defect == "unreadable":
        return (b"glTF\x02\x00\x00\x00" if fmt == "glb" else b"v 0 0 0\nf 1 2 oops\n") + b"\x00truncated upload"
    if defect == "empty":
        return encode(np.zeros((0, 3)), np.zeros((0, 3), np.int64), fmt)
    if defect == "non_manifold":  # a fin on the first edge: three faces share it
        a, b, c = vertices[faces[0]]
        normal = np.cross(b - a, c - a)
        extra = (a + b) / 2 + normal / np.linalg.norm(normal) * float(np.ptp(vertices, axis=0).max())
        return encode(
            np.vstack([vertices, extra]), np.vstack([faces, [[faces[0, 0], faces[0, 1], len(vertices)]]]), fmt
        )
    if defect == "degenerate_faces":  # faces with a repeated corner have no area
        bad = np.column_stack([faces[:3, 0], faces[:3, 0], faces[:3, 1]])
        return encode(vertices, np.vstack([faces, bad]), fmt)
    raise ValueError(f"defect must be one of {DEFECTS}, got {defect!r}")


def encode(vertices: np.ndarray, faces: np.ndarray, fmt: str) -> bytes:
    """The mesh as a glTF binary (via trimesh) or a plain OBJ file."""
    if fmt == "obj":
        lines = [f"v {x:.6f} {y:.6f} {z:.6f}\n" for x, y, z in vertices]
        lines += [f"f {a + 1} {b + 1} {c + 1}\n" for a, b, c in faces]
        return ("# mlplane simulator\n" + "".join(lines)).encode()
    import trimesh

    buffer = io.BytesIO()
    trimesh.Trimesh(vertices, faces, process=False).export(buffer, file_type="glb")
    return buffer.getvalue()


def defect_for(seed: int, item_id: int) -> str | None:
    """Which items upstream delivers broken: a per-item draw, independent of the world's streams."""
    draw = np.random.default_rng([seed, 97, item_id]).random()
    kind = int(draw // DEFECT_SHARE)
    return DEFECTS[kind] if kind < len(DEFECTS) else None
