"""Geometry features of one 3D mesh (glTF binary or OBJ), as the marketplace's game engine would
compute them: counts, area, volume, bounding box, convex-hull ratio, a symmetry score and statistics of
rendered silhouettes. Meshes are read with trimesh; silhouettes are rasterized with numpy (orthographic
projections, no OpenGL). Plain Python, no Dagster; `engines.retrieval.geometry_job` runs it over the catalogue.

A mesh that cannot be measured (unreadable, empty, degenerate faces, non-manifold edges) gives a row
whose `mesh_error` says why and whose measures are null, never an exception.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass

import numpy as np

RESOLUTION = 64  # silhouette pixels per side
# An orthographic view: (name, the two axes it keeps). "top" looks down z, "front" along y, "side" along x.
VIEWS = (("top", (0, 1)), ("front", (0, 2)), ("side", (1, 2)))


@dataclass
class MeshMeasures:
    vertex_count: int | None = None
    face_count: int | None = None
    surface_area: float | None = None
    volume: float | None = None  # only for a watertight mesh
    is_watertight: bool | None = None
    bbox_x: float | None = None
    bbox_y: float | None = None
    bbox_z: float | None = None
    convex_hull_ratio: float | None = None  # volume / convex hull volume (solidity), watertight only
    symmetry_score: float | None = None
    silhouette_fill_top: float | None = None
    silhouette_fill_front: float | None = None
    silhouette_fill_side: float | None = None
    mesh_error: str | None = None

    def row(self) -> dict:
        return asdict(self)


MEASURE_TYPES = {
    "vertex_count": "int64",
    "face_count": "int64",
    "surface_area": "float64",
    "volume": "float64",
    "is_watertight": "bool",
    "bbox_x": "float64",
    "bbox_y": "float64",
    "bbox_z": "float64",
    "convex_hull_ratio": "float64",
    "symmetry_score": "float64",
    "silhouette_fill_top": "float64",
    "silhouette_fill_front": "float64",
    "silhouette_fill_side": "float64",
    "mesh_error": "string",
}


def measure_file(data: bytes | None, file_type: str, resolution: int = RESOLUTION) -> MeshMeasures:
    """Every measure of a mesh file's bytes (`file_type` 'glb' or 'obj'); a broken one gets `mesh_error`."""
    if data is None:
        return MeshMeasures(mesh_error="mesh file missing")
    try:
        mesh = load_mesh(data, file_type)
    except Exception as error:  # loaders raise many types on a corrupt file
        return MeshMeasures(mesh_error=f"unreadable: {type(error).__name__}: {error}"[:300])
    problem = mesh_problem(mesh.vertices, mesh.faces)
    if problem:
        return MeshMeasures(mesh_error=problem)
    return measure(mesh, resolution)


def load_mesh(data: bytes, file_type: str):
    """The file's triangles as one trimesh.Trimesh, exactly as stored (no merging or repair)."""
    import trimesh

    if file_type not in ("glb", "obj"):
        raise ValueError(f"unsupported mesh format {file_type!r}")
    mesh = trimesh.load_mesh(io.BytesIO(data), file_type=file_type, process=False)
    if not isinstance(mesh, trimesh.Trimesh):
        raise ValueError(f"not a triangle mesh ({type(mesh).__name__})")
    return mesh


def mesh_problem(vertices: np.ndarray, faces: np.ndarray) -> str | None:
    """Why the mesh cannot be measured, or None."""
    if len(vertices) == 0 or len(faces) == 0:
        return "empty mesh: no faces"
    if not np.isfinite(vertices).all():
        return "non-finite vertex coordinates"
    corners = vertices[faces]
    areas = 0.5 * np.linalg.norm(np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]), axis=1)
    scale = float(np.ptp(vertices, axis=0).max()) or 1.0
    degenerate = int((areas <= 1e-12 * scale * scale).sum())
    if degenerate:
        return f"degenerate faces: {degenerate} of {len(faces)} have no area"
    edges = np.sort(faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2), axis=1)
    _, uses = np.unique(edges, axis=0, return_counts=True)
    shared = int((uses > 2).sum())
    if shared:
        return f"non-manifold: {shared} edge(s) shared by more than two faces"
    return None


def measure(mesh, resolution: int = RESOLUTION) -> MeshMeasures:
    watertight = bool(mesh.is_watertight and mesh.is_winding_consistent)
    volume = float(mesh.volume) if watertight else None
    hull_ratio = None
    if watertight:
        hull = float(mesh.convex_hull.volume)
        hull_ratio = volume / hull if hull > 0 else None
    extent = np.ptp(mesh.vertices, axis=0)
    masks = silhouettes(np.asarray(mesh.vertices), np.asarray(mesh.faces), resolution)
    return MeshMeasures(
        vertex_count=len(mesh.vertices),
        face_count=len(mesh.faces),
        surface_area=float(mesh.area),
        volume=volume,
        is_watertight=watertight,
        bbox_x=float(extent[0]),
        bbox_y=float(extent[1]),
        bbox_z=float(extent[2]),
        convex_hull_ratio=hull_ratio,
        symmetry_score=symmetry(masks["top"]),
        silhouette_fill_top=float(masks["top"].mean()),
        silhouette_fill_front=float(masks["front"].mean()),
        silhouette_fill_side=float(masks["side"].mean()),
    )


def silhouettes(vertices: np.ndarray, faces: np.ndarray, resolution: int = RESOLUTION) -> dict[str, np.ndarray]:
    """Boolean masks (resolution x resolution) of the three orthographic views, each stretched over the
    view's own bounding rectangle: the fill share is then the silhouette's area over that rectangle."""
    return {name: rasterize(vertices[:, axes][faces], resolution) for name, axes in VIEWS}


def rasterize(triangles: np.ndarray, resolution: int) -> np.ndarray:
    """Pixels (rows: second axis, columns: first) whose centre lies in any of the 2D triangles (T, 3, 2),
    filled span by span: every (triangle, pixel row) pair gives the run of pixel centres it covers."""
    flat = triangles.reshape(-1, 2)
    low, high = flat.min(axis=0), flat.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    tri = (triangles - low) / span * resolution  # pixel units; pixel (i, j) has centre (j + 0.5, i + 0.5)
    doubled_area = _cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    tri = tri[np.abs(doubled_area) > 1e-12]  # seen edge-on: covers nothing
    ys = tri[:, :, 1]
    first = np.clip(np.ceil(ys.min(axis=1) - 0.5), 0, resolution).astype(np.int64)
    last = np.clip(np.floor(ys.max(axis=1) - 0.5), -1, resolution - 1).astype(np.int64)
    rows_per = np.maximum(last - first + 1, 0)
    owner = np.repeat(np.arange(len(tri)), rows_per)
    row = first[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(rows_per) - rows_per, rows_per)
    centre_y = row + 0.5
    crossings = []
    for k in range(3):  # where the row's centre line crosses each edge, NaN where it does not
        a, b = tri[owner, k], tri[owner, (k + 1) % 3]
        dy = b[:, 1] - a[:, 1]
        spans = (np.minimum(a[:, 1], b[:, 1]) <= centre_y) & (centre_y <= np.maximum(a[:, 1], b[:, 1])) & (dy != 0)
        t = np.divide(centre_y - a[:, 1], dy, out=np.zeros_like(dy), where=dy != 0)
        crossings.append(np.where(spans, a[:, 0] + t * (b[:, 0] - a[:, 0]), np.nan))
    crossings = np.stack(crossings, axis=1)
    start = np.clip(np.ceil(np.nanmin(crossings, axis=1) - 0.5), 0, resolution).astype(np.int64)
    stop = np.clip(np.floor(np.nanmax(crossings, axis=1) - 0.5), -1, resolution - 1).astype(np.int64)
    keep = start <= stop
    steps = np.zeros((resolution, resolution + 1), np.int64)  # +1 where a run starts, -1 after it ends
    np.add.at(steps, (row[keep], start[keep]), 1)
    np.add.at(steps, (row[keep], stop[keep] + 1), -1)
    return np.cumsum(steps[:, :resolution], axis=1) > 0


def symmetry(mask: np.ndarray) -> float:
    """Mirror symmetry of a silhouette: the best intersection-over-union with its mirror image across
    either centre line of its bounding rectangle (1 for a symmetric shape)."""
    if not mask.any():
        return 0.0
    return max(float((mask & m).sum() / (mask | m).sum()) for m in (mask[::-1, :], mask[:, ::-1]))


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]
