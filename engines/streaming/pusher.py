"""The pusher: applies a job's committed window results to the online store through Feast's push
path (`FeatureStore.push` to the view's PushSource), in the main environment.

A window result is a complete value, not an increment, so a file applied twice, or a window
re-emitted after a restart from a checkpoint, never double-counts. Live rows (one per event, the
value at the event's time plus 1 ms) are complete values too, and go through the same newest-wins
rule per entity as the window-end rows."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from engines.streaming.sink import committed_names, fold_metrics, read_rows
from feature_defs.compile.flink import METRICS, WINDOW_END, FlinkJobSpec, ViewSink

MIN_KEEP_SECONDS = 60  # result files are kept at least this long after their commit
PRUNE_EVERY_SECONDS = 60


class OnlinePusher:
    """Applies a job's committed window results to the online store through Feast's push path.

    Per (view, entity) it remembers the newest window pushed, in SQLite next to the sink; a result
    for an older window is skipped, so the online value only moves forward, and applying the same
    file twice changes nothing.

    Flink emits no empty windows, so an entity missing from the newest window's results had no
    events in it: the pusher writes the view's empty values (zero counts, empty lists, null means
    and ratios) for it at that window, once, as the batch plan's zero rows do. Should that
    window's results for the entity arrive in a later commit (a job with several parallel
    subtasks), they replace the empty values, being as new."""

    def __init__(
        self,
        store,
        spec: FlinkJobSpec,
        on_push: Callable[[str, pd.DataFrame, float], None] | None = None,
        keep_seconds: float = 3600,
    ):
        self.store = store  # a feast.FeatureStore
        self.spec = spec
        self.on_push = on_push
        if keep_seconds < MIN_KEEP_SECONDS:
            raise ValueError(
                f"keep_seconds must be at least {MIN_KEEP_SECONDS}: a restart from a checkpoint may "
                "commit again the files of the last checkpoints"
            )
        self.keep_seconds = keep_seconds
        self.pruned_at = time.time()
        state = Path(spec.sink_root).parent / "pusher.db"
        state.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(state, check_same_thread=False)  # one poller at a time, any thread
        self.db.executescript(
            "CREATE TABLE IF NOT EXISTS applied_files (path TEXT PRIMARY KEY);"
            "CREATE TABLE IF NOT EXISTS newest_window (view TEXT, entity TEXT, window_end TEXT, "
            "PRIMARY KEY (view, entity));"
            "CREATE TABLE IF NOT EXISTS emptied (view TEXT, entity TEXT, PRIMARY KEY (view, entity));"
        )
        folders = [folder for info in spec.views.values() for folder in (info.sink, info.live) if folder]
        self.applied = {  # file names applied, per sink folder
            folder: {
                Path(p).name
                for (p,) in self.db.execute("SELECT path FROM applied_files WHERE path LIKE ?", (folder + "/%",))
            }
            for folder in folders
        }

    def poll(self) -> dict[str, int]:
        """Push every newly committed result; returns rows pushed per view."""
        pushed = {}
        for view, info in self.spec.views.items():
            window_rows, window_files = self._new_rows(info.sink)
            live_rows, live_files = self._new_rows(info.live) if info.live else ([], [])
            if not (window_files or live_files):
                continue
            pushed[view] = self._push(view, info, window_rows, live_rows)
            with self.db:
                self.db.executemany(
                    "INSERT OR IGNORE INTO applied_files VALUES (?)", [(str(f),) for f in window_files + live_files]
                )
            for path in window_files + live_files:
                self.applied[str(path.parent)].add(path.name)
        if time.time() - self.pruned_at >= PRUNE_EVERY_SECONDS:
            self.prune()
        return pushed

    def _new_rows(self, folder: str) -> tuple[list[dict], list[Path]]:
        applied = self.applied[folder]
        files = [Path(folder) / name for name in committed_names(Path(folder)) if name not in applied]
        return [row for path in files for row in read_rows(path)], files

    def prune(self, now: float | None = None) -> int:
        """Deletes applied result files older than `keep_seconds` and folds older metric files into
        the job's totals, so that a job running for weeks keeps a small sink and a fast poll (the
        online store and `newest_window` hold what the deleted files said). Returns files deleted."""
        now = now or time.time()
        cutoff = now - self.keep_seconds
        deleted = 0
        for folder, applied in self.applied.items():
            sink = Path(folder)
            old = [name for name in committed_names(sink) if name in applied and (sink / name).stat().st_mtime < cutoff]
            for name in old:
                (sink / name).unlink()
            with self.db:
                self.db.executemany("DELETE FROM applied_files WHERE path = ?", [(str(sink / name),) for name in old])
            applied.difference_update(old)
            deleted += len(old)
        self.pruned_at = now
        return deleted + fold_metrics(Path(self.spec.sink_root) / METRICS, cutoff)

    def _push(self, view: str, info: ViewSink, window_rows: list[dict], live_rows: list[dict]) -> int:
        keys = info.keys
        newest: dict[str, dict] = {}
        for row in window_rows + live_rows:
            entity = json.dumps([row[k] for k in keys])
            if entity not in newest or newest[entity][WINDOW_END] <= row[WINDOW_END]:
                newest[entity] = row
        known = dict(self.db.execute("SELECT entity, window_end FROM newest_window WHERE view = ?", (view,)))
        fresh = {e: r for e, r in newest.items() if e not in known or known[e] <= r[WINDOW_END]}
        pushed = 0
        if fresh:
            frame = self._frame(info, list(fresh.values()))
            self.store.push(info.push_source, frame, to=_push_mode_online())
            pushed_at = time.time()
            with self.db:
                self.db.executemany(
                    "INSERT OR REPLACE INTO newest_window VALUES (?, ?, ?)",
                    [(view, e, r[WINDOW_END]) for e, r in fresh.items()],
                )
                self.db.executemany("DELETE FROM emptied WHERE view = ? AND entity = ?", [(view, e) for e in fresh])
            if self.on_push:
                self.on_push(view, frame, pushed_at)
            pushed = len(frame)
        if not window_rows:  # only a window end says who had no events in the window
            return pushed
        return pushed + self._empty_the_silent(view, info, max(r[WINDOW_END] for r in window_rows))

    def _empty_the_silent(self, view: str, info: ViewSink, window_end: str) -> int:
        """Empty values at `window_end` for the entities without a result there, not yet emptied."""
        silent = [
            e
            for (e,) in self.db.execute(
                "SELECT entity FROM newest_window WHERE view = ? AND window_end < ? AND entity NOT IN "
                "(SELECT entity FROM emptied WHERE view = ?)",
                (view, window_end, view),
            )
        ]
        if not silent:
            return 0
        rows = [{**dict(zip(info.keys, json.loads(e))), WINDOW_END: window_end, **info.empty} for e in silent]
        frame = self._frame(info, rows)
        # a millisecond before the window's end, so that a result of that window committed later
        # still replaces it in stores that keep only strictly newer values (Redis)
        frame["event_timestamp"] -= pd.Timedelta(milliseconds=1)
        self.store.push(info.push_source, frame, to=_push_mode_online())
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO newest_window VALUES (?, ?, ?)", [(view, e, window_end) for e in silent]
            )
            self.db.executemany("INSERT OR REPLACE INTO emptied VALUES (?, ?)", [(view, e) for e in silent])
        return len(rows)

    @staticmethod
    def _frame(info: ViewSink, rows: list[dict]) -> pd.DataFrame:
        frame = pd.DataFrame(rows)
        # window ends are whole; live rows' have milliseconds: ISO 8601 parses both in one column
        frame["event_timestamp"] = pd.to_datetime(frame.pop(WINDOW_END), utc=True, format="ISO8601")
        frame = frame[[*info.keys, "event_timestamp", *info.features]]
        for feature, dtype in info.features.items():  # no qualifying values: an empty list, as offline
            if dtype.endswith("_list"):
                frame[feature] = [v if isinstance(v, list) else [] for v in frame[feature]]
        return frame

    def close(self) -> None:
        self.db.close()


def _push_mode_online():
    from feast.data_source import PushMode

    return PushMode.ONLINE


@dataclass(frozen=True)
class PusherConfig:
    """What the pusher process (FlinkResource starts it) needs: the job's spec and the online store."""

    spec: Path  # the job's spec.json
    store: dict  # engines.feature_store.FeatureStoreSettings fields

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"spec": str(self.spec), "store": self.store}))
        return path

    @classmethod
    def read(cls, path: Path) -> PusherConfig:
        data = json.loads(path.read_text())
        return cls(spec=Path(data["spec"]), store=data["store"])


def run_pusher(config_path: Path, interval_seconds: float = 0.5) -> None:
    """The pusher process: apply committed results until terminated."""
    from engines.feature_store import FeatureStoreEngine, FeatureStoreSettings

    config = PusherConfig.read(config_path)
    spec = FlinkJobSpec.from_dict(json.loads(config.spec.read_text()))
    settings = FeatureStoreSettings(
        **{
            **config.store,
            "repo_dir": Path(config.store["repo_dir"]),
            "offline_root": Path(config.store["offline_root"]),
        }
    )
    pusher = OnlinePusher(FeatureStoreEngine(settings).store, spec)
    while True:
        pushed = pusher.poll()
        if pushed:
            print(json.dumps({"at": time.time(), "pushed": pushed}), flush=True)
        time.sleep(interval_seconds)
