"""Geometry of meshes against independent recomputations: analytic shapes (boxes, prisms), a brute-force
rasterizer, and the simulator's answer key (each part's formula) for a simulated catalogue. No Ray here
(tests/engines/test_geometry_ray.py runs the job on Ray)."""

import math
from datetime import date

import numpy as np
import polars as pl
import pytest

from engines.retrieval.geometry import measure_file, rasterize, symmetry
from engines.retrieval.geometry_job import measure_items_locally
from simulator import Simulator, SimulatorConfig
from simulator.meshes import DEFECTS, MeshSpec, broken_file, encode

DAY = date(2026, 1, 1)


def box(centre, size) -> tuple:
    return ("box", np.asarray(centre, float), np.asarray(size, float), "")


def file_of(parts, fmt="glb", sections=8) -> bytes:
    return encode(*MeshSpec(tuple(parts), sections).build(), fmt)


@pytest.mark.parametrize("fmt", ["glb", "obj"])
def test_a_box_has_its_textbook_measures(fmt):
    x, y, z = 2.0, 3.0, 0.5
    got = measure_file(file_of([box((1, 1, 1), (x, y, z))], fmt), fmt)
    assert got.mesh_error is None and got.is_watertight
    assert (got.vertex_count, got.face_count) == (8, 12)
    assert got.surface_area == pytest.approx(2 * (x * y + y * z + x * z), rel=1e-6)
    assert got.volume == pytest.approx(x * y * z, rel=1e-6)
    assert (got.bbox_x, got.bbox_y, got.bbox_z) == pytest.approx((x, y, z), rel=1e-6)
    assert got.convex_hull_ratio == pytest.approx(1.0, rel=1e-6)
    assert got.symmetry_score == 1.0
    assert got.silhouette_fill_top == got.silhouette_fill_front == got.silhouette_fill_side == 1.0


def test_two_boxes_in_an_l_give_the_analytic_hull_ratio_fill_and_symmetry():
    # from above: A = [0,2]x[0,1], B = [0,1]x[1.2,2]; both 1 high
    a, b = box((1, 0.5, 0.5), (2, 1, 1)), box((0.5, 1.6, 0.5), (1, 0.8, 1))
    got = measure_file(file_of([a, b]), "glb", resolution=256)
    volume = 2 * 1 * 1 + 1 * 0.8 * 1
    assert got.volume == pytest.approx(volume, rel=1e-6)
    # the hull's footprint: the rectangle [0,2]x[0,1] plus the trapezoid up to B's top edge [0,1] at y=2
    hull_footprint = 2 * 1 + (2 + 1) / 2 * 1
    assert got.convex_hull_ratio == pytest.approx(volume / hull_footprint, rel=1e-6)
    assert got.silhouette_fill_top == pytest.approx((2 + 0.8) / 4, abs=0.01)
    # mirrored across x = 1: IoU (2) / (3.6); across y = 1: IoU 1.6 / 4.0
    assert got.symmetry_score == pytest.approx(max(2 / 3.6, 1.6 / 4.0), abs=0.01)


def test_a_prism_matches_the_polygon_formulas():
    n, a, b, h = 12, 0.5, 0.25, 2.0  # an elliptical 12-gon prism standing on z
    got = measure_file(
        file_of([("prism", np.zeros(3), np.array([2 * a, 2 * b, h]), "z")], sections=n), "glb", resolution=256
    )
    polygon = 0.5 * n * a * b * math.sin(2 * math.pi / n)
    corners = [(a * math.cos(2 * math.pi * k / n), b * math.sin(2 * math.pi * k / n)) for k in range(n + 1)]
    perimeter = sum(math.dist(p, q) for p, q in zip(corners, corners[1:]))
    assert (got.vertex_count, got.face_count) == (2 * n + 2, 4 * n)
    assert got.volume == pytest.approx(polygon * h, rel=1e-6)
    assert got.surface_area == pytest.approx(2 * polygon + perimeter * h, rel=1e-6)
    assert got.convex_hull_ratio == pytest.approx(1.0, rel=1e-6)  # convex
    assert got.silhouette_fill_top == pytest.approx(polygon / (2 * a * 2 * b), abs=0.01)
    assert got.silhouette_fill_front == got.silhouette_fill_side == 1.0


def test_rasterizer_matches_a_per_pixel_point_in_triangle_test():
    rng = np.random.default_rng(5)
    for _ in range(40):
        triangles = rng.uniform(-3, 7, (int(rng.integers(1, 9)), 3, 2))
        resolution = int(rng.integers(8, 48))
        low, high = triangles.reshape(-1, 2).min(axis=0), triangles.reshape(-1, 2).max(axis=0)
        pixels = (triangles - low) / (high - low) * resolution
        ys, xs = np.mgrid[0:resolution, 0:resolution]
        centres = np.stack([xs + 0.5, ys + 0.5], axis=-1)
        expected = np.zeros((resolution, resolution), bool)
        on_edge = np.zeros((resolution, resolution), bool)  # a centre exactly on an edge may go either way
        for corners in pixels:
            sides = []
            for k in range(3):
                edge, to_centre = corners[(k + 1) % 3] - corners[k], centres - corners[k]
                sides.append(edge[0] * to_centre[..., 1] - edge[1] * to_centre[..., 0])
                on_edge |= np.abs(sides[-1]) <= 1e-9 * np.linalg.norm(edge)
            expected |= np.all([s >= 0 for s in sides], axis=0) | np.all([s <= 0 for s in sides], axis=0)
        got = rasterize(triangles, resolution)
        assert np.array_equal(got[~on_edge], expected[~on_edge]) and expected.any()


def test_symmetry_of_masks():
    mask = np.zeros((4, 4), bool)
    mask[0, :] = True  # a bar along the top: mirrored left-right it is itself
    assert symmetry(mask) == 1.0
    mask[1:, 0] = True  # an L: each mirror keeps only part of it
    assert symmetry(mask) == pytest.approx(4 / 10)  # either mirror overlaps it in 4 of 10 pixels
    assert symmetry(np.zeros((4, 4), bool)) == 0.0


@pytest.mark.parametrize("fmt", ["glb", "obj"])
@pytest.mark.parametrize(
    "defect, reason",
    [
        ("non_manifold", "non-manifold"),
        ("degenerate_faces", "degenerate faces"),
        ("empty", "empty mesh"),
        ("unreadable", "unreadable"),
    ],
)
def test_broken_meshes_get_a_reason_not_an_exception(fmt, defect, reason):
    vertices, faces = MeshSpec((box((0, 0, 0), (1, 1, 1)),), 8).build()
    got = measure_file(broken_file(defect, vertices, faces, fmt), fmt)
    assert got.mesh_error.startswith(reason), got.mesh_error
    assert got.vertex_count is None and got.volume is None and got.symmetry_score is None


def test_missing_mesh_files_and_paths_get_a_reason(tmp_path):
    items = pl.DataFrame(
        {"item_id": [1, 2], "updated_at": [None, None], "mesh_path": ["meshes/1.glb", None]},
        schema={"item_id": pl.Int64, "updated_at": pl.Datetime("us", "UTC"), "mesh_path": pl.String},
    )
    rows = measure_items_locally(items, tmp_path)
    assert rows["mesh_error"].to_list() == ["mesh file missing: meshes/1.glb", "no mesh path"]
    with pytest.raises(ValueError, match="duplicate item_id"):
        measure_items_locally(pl.concat([items, items]), tmp_path)


def test_simulated_meshes_measure_as_the_answer_key_says(tmp_path):
    """Every new item of a simulated day: counts exact, area, volume and box as the parts' formulas give
    them, broken meshes exactly where the simulator broke them."""
    sim = Simulator(SimulatorConfig(seed=4, start_date=DAY).scaled(0.3), tmp_path)
    _, changed = sim.world.at(0)  # the first day: the whole catalogue, each item with its mesh
    truth = pl.DataFrame([sim.write_mesh(item) for item in changed.items.itertuples()], infer_schema_length=None)
    items = pl.from_pandas(changed.items[["item_id", "updated_at", "mesh_path"]]).with_columns(
        pl.col("updated_at").cast(pl.Datetime("us", "UTC"))
    )
    assert set(DEFECTS) == set(truth["mesh_defect"].drop_nulls())  # every kind of defect occurs
    assert sorted(items["mesh_path"].str.extract(r"\.(\w+)$").unique().to_list()) == ["glb", "obj"]
    rows = measure_items_locally(items, tmp_path / "landing").join(truth, on="item_id", suffix="_truth")
    assert rows.height == items.height == truth.height
    broken = rows.filter(pl.col("mesh_defect").is_not_null())
    assert broken["mesh_error"].null_count() == 0
    for reason, defect in zip(broken["mesh_error"], broken["mesh_defect"]):
        assert reason.startswith(
            {
                "non_manifold": "non-manifold",
                "degenerate_faces": "degenerate faces",
                "empty": "empty mesh",
                "unreadable": "unreadable",
            }[defect]
        ), (reason, defect)
    good = rows.filter(pl.col("mesh_defect").is_null())
    assert good["mesh_error"].null_count() == good.height and good["is_watertight"].all()
    assert (good["vertex_count"] == good["vertex_count_truth"]).all()
    assert (good["face_count"] == good["face_count_truth"]).all()
    for column in ("surface_area", "volume", "bbox_x", "bbox_y", "bbox_z"):
        assert np.allclose(good[column], good[f"{column}_truth"], rtol=1e-4), column
    assert good["convex_hull_ratio"].is_between(0.05, 1 + 1e-6).all()
    assert good["symmetry_score"].is_between(0, 1).all() and good["symmetry_score"].n_unique() > 10
