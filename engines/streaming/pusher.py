"""The pusher: applies a job's committed window results to the online store, in the main
environment, writing each view's rows as Feast's push to the view's PushSource would
(`engines.features.online_write.OnlineWriter`: the view resolved once, one statement for a batch in SQLite).

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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from engines.streaming.sink import committed_names, fold_metrics, read_rows
from feature_defs.compile.flink import METRICS, WINDOW_END, FlinkJobSpec, ViewSink

if TYPE_CHECKING:  # imported at the first push: it imports Feast
    from engines.features.online_write import OnlineWriter

MIN_KEEP_SECONDS = 60  # result files are kept at least this long after their commit
PRUNE_EVERY_SECONDS = 60


class OnlinePusher:
    """Applies a job's committed window results to the online store.

    Per (view, entity) it remembers the newest window pushed, in SQLite next to the sink (and in
    memory: reading it back for every push took longer than the push); a result
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
        on_push: Callable[[str, list[dict], float], None] | None = None,  # view, rows written, when
        keep_seconds: float = 3600,
        # live rows' files: a row per event, a file per roll (50 ms for fresh ones) and superseded within seconds;
        # an hour of them would make every poll list tens of thousands of files per view
        live_keep_seconds: float = MIN_KEEP_SECONDS,
    ):
        self.store = store  # a feast.FeatureStore
        self.spec = spec
        self.on_push = on_push
        if min(keep_seconds, live_keep_seconds) < MIN_KEEP_SECONDS:
            raise ValueError(
                f"keep_seconds and live_keep_seconds must be at least {MIN_KEEP_SECONDS}: a restart from "
                "a checkpoint may commit again the files of the last checkpoints"
            )
        self.keep_seconds = keep_seconds
        self.live_keep_seconds = live_keep_seconds
        self.pruned_at = time.time()
        state = Path(spec.sink_root).parent / "pusher.db"
        state.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(state, check_same_thread=False)  # one poller at a time, any thread
        self.db.executescript(
            "CREATE TABLE IF NOT EXISTS applied_files (path TEXT PRIMARY KEY);"
            "CREATE TABLE IF NOT EXISTS newest_window (view TEXT, entity TEXT, window_end TEXT, "
            "PRIMARY KEY (view, entity));"
            "CREATE TABLE IF NOT EXISTS emptied (view TEXT, entity TEXT, PRIMARY KEY (view, entity));"
            # a commit per push without an fsync each: what a crash loses is applied again, which
            # changes nothing (complete values, newest wins)
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"
        )
        self.newest: dict[str, dict[str, str]] = {view: {} for view in spec.views}  # entity -> window end
        self.emptied: dict[str, set[str]] = {view: set() for view in spec.views}
        for view, entity, end in self.db.execute("SELECT view, entity, window_end FROM newest_window"):
            self.newest.setdefault(view, {})[entity] = end
        for view, entity in self.db.execute("SELECT view, entity FROM emptied"):
            self.emptied.setdefault(view, set()).add(entity)
        self.writers: dict[str, OnlineWriter] = {}  # per view, made at its first push
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
        """Deletes applied result files older than `keep_seconds` (live rows' after `live_keep_seconds`)
        and folds older metric files into the job's totals, so that a job running for weeks keeps a
        small sink and a fast poll (the online store and `newest_window` hold what the deleted files
        said). Returns files deleted."""
        now = now or time.time()
        live = {info.live for info in self.spec.views.values() if info.live}
        deleted = 0
        for folder, applied in self.applied.items():
            cutoff = now - (self.live_keep_seconds if folder in live else self.keep_seconds)
            sink = Path(folder)
            old = [name for name in committed_names(sink) if name in applied and (sink / name).stat().st_mtime < cutoff]
            for name in old:
                (sink / name).unlink()
            with self.db:
                self.db.executemany("DELETE FROM applied_files WHERE path = ?", [(str(sink / name),) for name in old])
            applied.difference_update(old)
            deleted += len(old)
        self.pruned_at = now
        return deleted + fold_metrics(Path(self.spec.sink_root) / METRICS, now - self.keep_seconds)

    def _push(self, view: str, info: ViewSink, window_rows: list[dict], live_rows: list[dict]) -> int:
        by_key: dict[tuple, dict] = {}  # a row per event with live rows: keyed as JSON only once deduplicated
        for row in window_rows + live_rows:
            key = tuple(row[k] for k in info.keys)
            if key not in by_key or by_key[key][WINDOW_END] <= row[WINDOW_END]:
                by_key[key] = row
        newest = {json.dumps(list(key)): row for key, row in by_key.items()}
        known = self.newest[view]
        fresh = {e: r for e, r in newest.items() if e not in known or known[e] <= r[WINDOW_END]}
        if fresh:
            rows = _online_rows(info, fresh.values())
            self._writer(view).write(rows)
            pushed_at = time.time()
            self._remember(view, {e: r[WINDOW_END] for e, r in fresh.items()}, emptied=False)
            if self.on_push:
                self.on_push(view, rows, pushed_at)
        if not window_rows:  # only a window end says who had no events in the window
            return len(fresh)
        return len(fresh) + self._empty_the_silent(view, info, max(r[WINDOW_END] for r in window_rows))

    def _empty_the_silent(self, view: str, info: ViewSink, window_end: str) -> int:
        """Empty values at `window_end` for the entities without a result there, not yet emptied."""
        emptied = self.emptied[view]
        silent = [e for e, end in self.newest[view].items() if end < window_end and e not in emptied]
        if not silent:
            return 0
        rows = _online_rows(info, ({**dict(zip(info.keys, json.loads(e))), WINDOW_END: window_end} for e in silent))
        for row in rows:
            row.update(info.empty)
            # a millisecond before the window's end, so that a result of that window committed later
            # still replaces it in stores that keep only strictly newer values (Redis)
            row["event_timestamp"] -= timedelta(milliseconds=1)
        self._writer(view).write(rows)
        self._remember(view, dict.fromkeys(silent, window_end), emptied=True)
        return len(rows)

    def _remember(self, view: str, window_ends: dict[str, str], emptied: bool) -> None:
        """Each entity's newest window pushed, and whether it was its empty values, here and in SQLite."""
        self.newest[view].update(window_ends)
        entities = [(view, e) for e in window_ends]
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO newest_window VALUES (?, ?, ?)", [(view, *i) for i in window_ends.items()]
            )
            if emptied:
                self.db.executemany("INSERT OR REPLACE INTO emptied VALUES (?, ?)", entities)
            else:
                self.db.executemany("DELETE FROM emptied WHERE view = ? AND entity = ?", entities)
        if emptied:
            self.emptied[view].update(window_ends)
        else:
            self.emptied[view].difference_update(window_ends)

    def _writer(self, view: str) -> OnlineWriter:
        if view not in self.writers:
            from engines.features.online_write import OnlineWriter  # imports Feast: not when the CLI loads the profiles

            self.writers[view] = OnlineWriter(self.store, view)
        return self.writers[view]

    def close(self) -> None:
        self.db.close()


def _online_rows(info: ViewSink, rows) -> list[dict]:
    """Sink rows as the online store takes them: join keys, the window end as `event_timestamp`,
    the features (a list with no qualifying values is an empty list, as offline)."""
    out = []
    for row in rows:
        online = {k: row[k] for k in info.keys}
        # window ends are whole seconds, live rows' have milliseconds
        online["event_timestamp"] = datetime.fromisoformat(row[WINDOW_END]).replace(tzinfo=UTC)
        for feature, dtype in info.features.items():
            value = row.get(feature)
            online[feature] = (value if isinstance(value, list) else []) if dtype.endswith("_list") else value
        out.append(online)
    return out


@dataclass(frozen=True)
class PusherConfig:
    """What the pusher process (FlinkResource starts it) needs: the job's spec and the online store."""

    spec: Path  # the job's spec.json
    store: dict  # engines.features.feature_store.FeatureStoreSettings fields
    interval_seconds: float = 0.5  # between polls

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"spec": str(self.spec), "store": self.store, "interval": self.interval_seconds}))
        return path

    @classmethod
    def read(cls, path: Path) -> PusherConfig:
        data = json.loads(path.read_text())
        return cls(spec=Path(data["spec"]), store=data["store"], interval_seconds=data["interval"])


def run_pusher(config_path: Path) -> None:
    """The pusher process: apply committed results until terminated."""
    from engines.features.feature_store import FeatureStoreEngine, FeatureStoreSettings

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
        time.sleep(config.interval_seconds)
