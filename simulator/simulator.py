"""Writes the simulated marketplace's landing files and the answer key (sim_truth)."""

from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import meshes, thumbnails
from .config import SimulatorConfig
from .events import DayEvents, generate_day_events
from .files import DIMENSIONS, EVENT_STREAMS, SCHEMAS, frame_to_table, to_jsonl, write_bytes, write_table
from .vocabulary import CATEGORY_NAMES
from .world import EVENTS, LATE, MALFORMED, US_PER_DAY, World, day_start_us, rng_for

MALFORMED_KINDS = ("bad_json", "missing_column", "wrong_type", "out_of_day")
# The column a malformed file drops or corrupts, per stream.
_USER_COLUMN = {"interactions": "user_id", "chat_messages": "sender_id", "abuse_reports": "reporter_id"}
TRUTH_SCHEMAS = {
    "items": pa.schema(
        [
            ("item_id", pa.int64()),
            ("is_violation", pa.bool_()),
            ("reference_item_id", pa.int64()),
            ("is_reference", pa.bool_()),
        ]
    ),
    "users": pa.schema([("user_id", pa.int64()), ("taste_cluster", pa.int64()), ("is_abuser", pa.bool_())]),
    # the geometry of each new item's mesh from its parts' formulas; null measures where it is broken
    "meshes": pa.schema(
        [
            ("item_id", pa.int64()),
            ("mesh_defect", pa.string()),
            ("vertex_count", pa.int64()),
            ("face_count", pa.int64()),
            ("surface_area", pa.float64()),
            ("volume", pa.float64()),
            ("bbox_x", pa.float64()),
            ("bbox_y", pa.float64()),
            ("bbox_z", pa.float64()),
        ]
    ),
}
LATE_VOLUME = 0.05  # a late file holds about 5% of a normal day


def _day_folder(root: Path, stream: str, day: date) -> Path:
    return root / stream / f"date={day:%Y-%m-%d}"


class Simulator:
    def __init__(self, config: SimulatorConfig, data_dir: Path | str, progress: Callable[[str], None] | None = None):
        self.config = config
        self.data_dir = Path(data_dir)
        self.landing = self.data_dir / "landing"
        self.truth = self.data_dir / "sim_truth"
        self.world = World(config)
        self._progress = progress
        self._ext = config.file_format

    def day_index(self, day: date) -> int:
        index = (day - self.config.start_date).days
        if index < 0:
            raise ValueError(f"{day} is before start_date {self.config.start_date}")
        return index

    def events(
        self, day: date, volume: float = 1.0, id_tag: str = "", rng_stream: int = EVENTS, batch: int = 0
    ) -> DayEvents:
        """The events of `day`, not written; the day's main batch unless another rng stream/batch is given."""
        index = self.day_index(day)
        state, _ = self.world.at(index)
        rng = rng_for(self.config.seed, rng_stream, index, batch)
        return generate_day_events(self.config, state, self.world.cluster_affinity, day, rng, volume, id_tag)

    def write_day(self, day: date) -> dict:
        """Write the day's dimension changes, thumbnails of new items, event streams and truth."""
        index = self.day_index(day)
        _, changed = self.world.at(index)
        files: dict[str, str] = {}
        rows: dict[str, int] = {}

        for name in DIMENSIONS:
            frame = getattr(changed, name)
            table = frame_to_table(frame, SCHEMAS[name])
            files[name] = str(self._write(table, name, day, "part-0000"))
            rows[name] = table.num_rows

        # Day 0 carries the whole initial catalogue; later days only the items created that day.
        start = day_start_us(day)
        new_items = changed.items if index == 0 else changed.items[changed.items.created_at >= start]
        new_users = changed.users if index == 0 else changed.users[changed.users.signup_at >= start]
        mesh_truth = []
        for item in new_items.itertuples():
            self._write_thumbnail(item)
            mesh_truth.append(self.write_mesh(item))

        events = self.events(day)
        for stream in EVENT_STREAMS:
            table = getattr(events, stream)
            files[stream] = str(self._write(table, stream, day, "part-0000"))
            rows[stream] = table.num_rows
        self._write_truth(day, new_items, new_users, events.chat_truth)
        self._write_truth_table(pa.Table.from_pylist(mesh_truth, TRUTH_SCHEMAS["meshes"]), "meshes", day, "part-0000")

        summary = {
            "date": day.isoformat(),
            "files": files,
            "rows": rows,
            "thumbnails": len(new_items),
            "meshes": len(new_items),
        }
        if self._progress:
            self._progress(f"{day}: " + ", ".join(f"{k}={v}" for k, v in rows.items()))
        return summary

    def run(self, days: int) -> dict:
        """Write start_date .. start_date + days - 1."""
        summaries = [self.write_day(self.config.start_date + timedelta(days=k)) for k in range(days)]
        totals = {name: sum(s["rows"][name] for s in summaries) for name in DIMENSIONS + EVENT_STREAMS}
        return {
            "data_dir": str(self.data_dir),
            "dates": [s["date"] for s in summaries],
            "files_written": sum(len(s["files"]) for s in summaries),
            "thumbnails_written": sum(s["thumbnails"] for s in summaries),
            "meshes_written": sum(s["meshes"] for s in summaries),
            "rows": totals,
            "days": summaries,
        }

    def write_late_file(self, day: date, stream: str, batch: int = 1) -> Path:
        """Additional events of an earlier `day` with new ids, as file late-<batch> in that day's folder."""
        self._check_stream(stream)
        events = self.events(day, LATE_VOLUME, id_tag=f"-late{batch}", rng_stream=LATE, batch=batch)
        if stream == "chat_messages":
            self._write_truth_table(events.chat_truth, "chat", day, f"late-{batch:04d}")
        return self._write(getattr(events, stream), stream, day, f"late-{batch:04d}")

    def write_duplicate_file(self, day: date, stream: str) -> Path:
        """A byte copy of the day's main file under another name (a re-delivery)."""
        source = _day_folder(self.landing, stream, day) / f"part-0000.{self._ext}"
        if not source.exists():
            raise FileNotFoundError(source)
        return write_bytes(source.with_name(f"redelivery-part-0000.{self._ext}"), source.read_bytes())

    def write_malformed_file(self, day: date, stream: str = "interactions", kind: str = "bad_json") -> Path:
        """A broken file next to the day's good ones; its rows have ids of their own.

        bad_json: JSON lines with one truncated line; missing_column: the user column is absent;
        wrong_type: the user column holds strings; out_of_day: timestamps fall on the next day.
        """
        self._check_stream(stream)
        if kind not in MALFORMED_KINDS:
            raise ValueError(f"kind must be one of {MALFORMED_KINDS}")
        events = self.events(day, id_tag=f"-bad-{kind}", rng_stream=MALFORMED, batch=MALFORMED_KINDS.index(kind))
        table = getattr(events, stream).slice(0, 50)
        if table.num_rows == 0:
            raise RuntimeError(f"no {stream} rows on {day} to build a malformed file from")
        name = f"malformed-{kind}"
        column = _USER_COLUMN[stream]
        if kind == "bad_json":
            lines = to_jsonl(table).splitlines(keepends=True)
            middle = len(lines) // 2
            lines[middle] = lines[middle][: len(lines[middle]) // 2] + "\n"
            path = _day_folder(self.landing, stream, day) / f"{name}.jsonl"
            return write_bytes(path, "".join(lines).encode())
        if kind == "missing_column":
            table = table.drop_columns([column])
        elif kind == "wrong_type":
            as_text = pc.binary_join_element_wise("user-", pc.cast(table[column], pa.string()), "")
            table = table.set_column(table.schema.get_field_index(column), column, as_text)
        else:  # out_of_day
            shifted = pc.add(table["event_timestamp"], pa.scalar(US_PER_DAY, pa.duration("us")))
            table = table.set_column(1, "event_timestamp", shifted)
        return self._write(table, stream, day, name)

    def _check_stream(self, stream: str) -> None:
        if stream not in EVENT_STREAMS:
            raise ValueError(f"stream must be one of {EVENT_STREAMS}")

    def _write(self, table: pa.Table, stream: str, day: date, stem: str) -> Path:
        return write_table(table, _day_folder(self.landing, stream, day) / f"{stem}.{self._ext}")

    def _write_thumbnail(self, item) -> None:
        image = thumbnails.render(
            item.category, item.colour, item.material, item.render_seed, self.config.thumbnail_size
        )
        if item.perturb_seed >= 0:
            image = thumbnails.perturb(image, item.perturb_seed)
        write_bytes(self.landing / item.thumbnail_path, thumbnails.to_png(image))

    def write_mesh(self, item) -> dict:
        """The item's mesh file (broken for a share of items) and its answer-key row."""
        spec = meshes.mesh_spec(
            item.category, (item.bbox_x, item.bbox_y, item.bbox_z), item.mesh_sections, item.render_seed, item.mesh_fill
        )
        vertices, faces = spec.build()
        fmt = item.mesh_path.rsplit(".", 1)[1]
        defect = meshes.defect_for(self.config.seed, item.item_id)
        data = meshes.broken_file(defect, vertices, faces, fmt) if defect else meshes.encode(vertices, faces, fmt)
        write_bytes(self.landing / item.mesh_path, data)
        if defect:
            return {"item_id": item.item_id, "mesh_defect": defect}
        truth = spec.truth()
        return {
            "item_id": item.item_id,
            "mesh_defect": None,
            "vertex_count": truth.vertex_count,
            "face_count": truth.face_count,
            "surface_area": truth.surface_area,
            "volume": truth.volume,
            **dict(zip(("bbox_x", "bbox_y", "bbox_z"), truth.bbox)),
        }

    def _write_truth_table(self, table: pa.Table, name: str, day: date, stem: str) -> None:
        write_table(table, _day_folder(self.truth, name, day) / f"{stem}.parquet")

    def _write_truth(self, day: date, new_items: pd.DataFrame, new_users: pd.DataFrame, chat_truth: pa.Table) -> None:
        items = new_items[["item_id", "is_violation", "reference_item_id", "is_reference"]]
        self._write_truth_table(frame_to_table(items, TRUTH_SCHEMAS["items"]), "items", day, "part-0000")
        users = new_users[["user_id", "taste_cluster", "is_abuser"]]
        self._write_truth_table(frame_to_table(users, TRUTH_SCHEMAS["users"]), "users", day, "part-0000")
        self._write_truth_table(chat_truth, "chat", day, "part-0000")
        # Static parts of the answer key, rewritten identically with every day.
        references = pa.table({"item_id": self.world.references.item_id.to_numpy()})
        write_table(references, self.truth / "reference_items.parquet")
        affinity = self.world.cluster_affinity
        clusters, categories = np.indices(affinity.shape)
        write_table(
            pa.table(
                {
                    "taste_cluster": clusters.ravel().astype(np.int64),
                    "category": CATEGORY_NAMES[categories.ravel()],
                    "affinity": affinity.ravel(),
                }
            ),
            self.truth / "taste_clusters.parquet",
        )


def simulate(
    data_dir: Path | str,
    days: int,
    seed: int = 0,
    start_date: date = SimulatorConfig.start_date,
    scale: float = 1.0,
    file_format: str = "parquet",
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Write `days` days of a default-shaped marketplace, `scale` times the default size."""
    config = SimulatorConfig(seed=seed, start_date=start_date, file_format=file_format).scaled(scale)
    return Simulator(config, data_dir, progress).run(days)
