"""Simulator parameters."""

import json
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path

FILE_FORMATS = ("parquet", "jsonl")


@dataclass(frozen=True)
class SimulatorConfig:
    seed: int = 0
    start_date: date = date(2026, 1, 1)
    # World size before start_date.
    n_users: int = 2000
    n_creators: int = 150
    n_items: int = 1500
    n_taste_clusters: int = 8
    n_reference_items: int = 15  # the known-violating originals that variants copy
    # World growth per day.
    new_users_per_day: int = 20
    new_creators_per_day: int = 2
    new_items_per_day: int = 30
    price_change_fraction: float = 0.01  # of existing items, per day
    creator_rename_fraction: float = 0.005  # of existing creators, per day
    violation_fraction: float = 0.03  # of items (initial catalogue and new ones)
    # Behaviour.
    daily_active_fraction: float = 0.6
    impressions_per_user_day: float = 20.0  # mean per active user
    abuser_fraction: float = 0.02
    chat_messages_per_user_day: float = 0.3  # mean per active non-abuser; abusers send 4x
    thumbnail_size: int = 64
    file_format: str = "parquet"

    def __post_init__(self):
        if self.file_format not in FILE_FORMATS:
            raise ValueError(f"file_format must be one of {FILE_FORMATS}, got {self.file_format!r}")
        if not 0 < self.n_creators <= self.n_users:
            raise ValueError("need 0 < n_creators <= n_users")
        if not 0 < self.n_reference_items <= self.n_items // 4:
            raise ValueError("need 0 < n_reference_items <= n_items / 4")
        if self.seed < 0:
            raise ValueError("seed must be >= 0")

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), default=str, indent=2))

    @classmethod
    def load(cls, path: Path) -> "SimulatorConfig":
        saved = json.loads(path.read_text())
        return cls(**{**saved, "start_date": date.fromisoformat(saved["start_date"])})

    def scaled(self, scale: float) -> "SimulatorConfig":
        """The same marketplace with `scale` times the users, creators and items (rates unchanged)."""

        def s(n: int) -> int:
            return max(1, round(n * scale))

        return replace(
            self,
            n_users=s(self.n_users),
            n_creators=s(self.n_creators),
            n_items=max(8, s(self.n_items)),
            n_reference_items=s(self.n_reference_items),
            new_users_per_day=s(self.new_users_per_day),
            new_creators_per_day=s(self.new_creators_per_day),
            new_items_per_day=s(self.new_items_per_day),
        )
