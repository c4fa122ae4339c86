"""What the simulated users would do with an item they are shown: the click model the simulator draws
from, for any (user, item) on a day. It is part of the simulator's answer key (as `sim_truth/` is): the
platform's pipelines never read it. A benchmark ranks with it (the oracle, the best any model could do)
and the demo plays the users who see the model server's lists."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date

import numpy as np

from .config import SimulatorConfig
from .events import IMPRESSION_AFFINITY, click_logit, play_logit
from .world import World


@dataclass(frozen=True)
class AnswerKey:
    cluster: dict[int, int]  # user -> taste cluster
    category: dict[int, int]  # item -> category index
    pop_z: dict[int, float]  # item -> latent popularity
    log_affinity: np.ndarray  # cluster x category

    @classmethod
    def on(cls, config: SimulatorConfig, day: date) -> AnswerKey:
        """The world at the end of `day` (users and items created by then)."""
        world = World(config)
        state, _ = world.at((day - config.start_date).days)
        items = state.items
        return cls(
            dict(zip(state.users.user_id.tolist(), state.users.taste_cluster.tolist())),
            dict(zip(items.item_id.tolist(), items.category_idx.tolist())),
            dict(zip(items.item_id.tolist(), items.pop_z.tolist())),
            np.log(world.cluster_affinity),
        )

    def click_logit(self, user: int, item: int) -> float:
        return float(click_logit(self.log_affinity[self.cluster[user], self.category[item]], self.pop_z[item]))

    def click_probability(self, user: int, item: int) -> float:
        """P(click | shown); 0 for a user or item the world does not hold."""
        if user not in self.cluster or item not in self.category:
            return 0.0
        return 1 / (1 + math.exp(-self.click_logit(user, item)))

    def play_probability(self, user: int, item: int) -> float:
        """P(play | clicked)."""
        if user not in self.cluster or item not in self.category:
            return 0.0
        return 1 / (1 + math.exp(-play_logit(self.log_affinity[self.cluster[user], self.category[item]])))

    def expected_clicks(self, user: int, item: int) -> float:
        """Exposure (how often the feed shows it) times P(click | shown): the ranking the oracle uses."""
        taste = self.log_affinity[self.cluster[user], self.category[item]]
        exposure = math.exp(1.5 * self.pop_z[item] + IMPRESSION_AFFINITY * taste)
        return exposure * self.click_probability(user, item)
