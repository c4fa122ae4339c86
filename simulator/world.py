"""The simulated world (users, creators, items) and how it changes day by day.

Every random draw comes from `rng_for(seed, stream, index)`, so the world at day k is a pure
function of the config: it is rebuilt by replaying the (cheap) dimension changes of days 0..k,
never by reading files, and does not depend on which days were written before.

Ids are contiguous from 1, so the row position of an id in the state tables is `id - 1`.
Columns beyond the landing contract (taste_cluster, pop_z, render_seed, mesh_sections, bbox_x, ...) are
hidden truth.
"""

from dataclasses import dataclass
from datetime import date, timedelta

import numpy as np
import pandas as pd

from .config import SimulatorConfig
from .meshes import mesh_file_name, mesh_vertex_count, sections_for
from .vocabulary import (
    ADJECTIVE_SYNONYMS,
    ADJECTIVES,
    AGE_BUCKETS,
    AGE_WEIGHTS,
    CATEGORIES,
    CATEGORY_NAMES,
    CATEGORY_WEIGHTS,
    COLOUR_NAMES,
    COUNTRY_CODES,
    COUNTRY_REGIONS,
    COUNTRY_WEIGHTS,
    DEVICE_WEIGHTS,
    DEVICES,
    MATERIAL_SENTENCES,
    MATERIALS,
    NAME_PREFIXES,
    NAME_SUFFIXES,
    NOUN_SYNONYMS,
)

US_PER_SECOND = 1_000_000
US_PER_DAY = 86_400 * US_PER_SECOND

# Independent random streams.
INIT, WORLD_DAY, EVENTS, LATE, MALFORMED = range(5)


def rng_for(seed: int, stream: int, *indices: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, *indices])


def day_start_us(day: date) -> int:
    return (day - date(1970, 1, 1)).days * US_PER_DAY


@dataclass
class Tables:
    users: pd.DataFrame
    creators: pd.DataFrame
    items: pd.DataFrame


def make_cluster_affinity(rng: np.random.Generator, n_clusters: int) -> np.ndarray:
    """(cluster x category) relative preference, 1 = indifferent; each cluster loves 2 categories."""
    n_categories = len(CATEGORIES)
    preference = np.full((n_clusters, n_categories), 0.3)
    for cluster in range(n_clusters):
        preference[cluster, rng.choice(n_categories, 2, replace=False)] += 3.0
    return preference / preference.sum(axis=1, keepdims=True) * n_categories


def _make_users(rng, cfg: SimulatorConfig, first_id: int, signup_at: np.ndarray) -> pd.DataFrame:
    n = len(signup_at)
    country = rng.choice(len(COUNTRY_CODES), n, p=COUNTRY_WEIGHTS)
    return pd.DataFrame(
        {
            "user_id": np.arange(first_id, first_id + n, dtype=np.int64),
            "country": COUNTRY_CODES[country],
            "region": COUNTRY_REGIONS[country],
            "age_bucket": rng.choice(AGE_BUCKETS, n, p=AGE_WEIGHTS),
            "is_creator": np.zeros(n, dtype=bool),
            "signup_at": signup_at,
            "updated_at": signup_at,
            "taste_cluster": rng.integers(0, cfg.n_taste_clusters, n),
            "is_abuser": rng.random(n) < cfg.abuser_fraction,
            "device": rng.choice(DEVICES, n, p=DEVICE_WEIGHTS),
            "activity": rng.lognormal(-0.125, 0.5, n),  # mean 1: some users are much more active
        }
    )


def _display_names(rng, n: int) -> list[str]:
    prefix = rng.integers(0, len(NAME_PREFIXES), n)
    suffix = rng.integers(0, len(NAME_SUFFIXES), n)
    number = rng.integers(1, 1000, n)
    return [f"{NAME_PREFIXES[p]}{NAME_SUFFIXES[s]}{k}" for p, s, k in zip(prefix, suffix, number)]


def _make_creators(rng, first_id: int, user_ids: np.ndarray, joined_at: np.ndarray) -> pd.DataFrame:
    n = len(user_ids)
    return pd.DataFrame(
        {
            "creator_id": np.arange(first_id, first_id + n, dtype=np.int64),
            "user_id": np.asarray(user_ids, dtype=np.int64),
            "display_name": _display_names(rng, n),
            "joined_at": joined_at,
            "updated_at": joined_at,
            "productivity": rng.lognormal(0, 1, n),  # a few creators make most items
        }
    )


def _price(base: np.ndarray) -> np.ndarray:
    return np.maximum(np.floor(base), 0) + 0.99


def _make_items(rng, first_id: int, creator_ids: np.ndarray, created_at: np.ndarray) -> pd.DataFrame:
    n = len(created_at)
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    category = rng.choice(len(CATEGORIES), n, p=CATEGORY_WEIGHTS)
    noun = [CATEGORIES[c].nouns[k] for c, k in zip(category, rng.integers(0, 5, n))]
    colour = COLOUR_NAMES[rng.integers(0, len(COLOUR_NAMES), n)]
    material = MATERIALS[rng.integers(0, len(MATERIALS), n)]
    adjective = ADJECTIVES[rng.integers(0, len(ADJECTIVES), n)]
    vertices = np.array([c.median_vertices for c in CATEGORIES])[category] * rng.lognormal(0, 0.4, n)
    sections = np.array([sections_for(v) for v in vertices], dtype=np.int64)
    bbox = np.array([c.bbox for c in CATEGORIES])[category] * rng.lognormal(0, 0.15, (n, 3))
    price = _price(np.array([c.base_price for c in CATEGORIES])[category] * rng.lognormal(0, 0.5, n))
    return pd.DataFrame(
        {
            "item_id": ids,
            "creator_id": np.asarray(creator_ids, dtype=np.int64),
            "category": CATEGORY_NAMES[category],
            "title": [f"{c.capitalize()} {m} {a} {w}" for c, m, a, w in zip(colour, material, adjective, noun)],
            "description": [
                f"A {a} {c} {w} for your {CATEGORY_NAMES[k]} collection. {MATERIAL_SENTENCES[m]} "
                f"Game-ready, {v} vertices."
                for a, c, w, k, m, v in zip(
                    adjective, colour, noun, category, material, mesh_vertex_count(CATEGORY_NAMES[category], sections)
                )
            ],
            "price": price,
            "mesh_path": [mesh_file_name(int(i)) for i in ids],
            # hidden: the mesh's detail, how much of its box the parts fill, and its size in metres
            "mesh_sections": sections,
            "mesh_fill": rng.uniform(0.85, 1.0, n),
            "bbox_x": np.round(bbox[:, 0], 3),
            "bbox_y": np.round(bbox[:, 1], 3),
            "bbox_z": np.round(bbox[:, 2], 3),
            "thumbnail_path": [f"thumbnails/{i}.png" for i in ids],
            "created_at": created_at,
            "updated_at": created_at,
            "category_idx": category,
            "noun": noun,
            "adjective": adjective,
            "colour": colour,
            "material": material,
            "pop_z": rng.normal(0, 1, n),  # latent popularity/quality
            "render_seed": rng.integers(0, 2**31, n),
            "perturb_seed": np.full(n, -1),  # >= 0 for violating variants
            "prev_price": price,  # price before today's change, for purchases made before it
            "is_violation": np.zeros(n, dtype=bool),
            "is_reference": np.zeros(n, dtype=bool),
            "reference_item_id": pd.array([pd.NA] * n, dtype="Int64"),
        }
    )


def _make_variants(
    rng, items: pd.DataFrame, rows: np.ndarray, references: pd.DataFrame, creators: pd.DataFrame
) -> None:
    """Turn items[rows] into disguised copies of random references, by other creators (in place)."""
    for row in rows:
        ref = references.iloc[rng.integers(0, len(references))]
        created_at = items.at[row, "created_at"]
        others = creators[creators.creator_id != ref.creator_id]
        timely = others[others.joined_at <= created_at]
        pool = timely if len(timely) else others
        if len(pool):
            items.at[row, "creator_id"] = pool.creator_id.iloc[rng.integers(0, len(pool))]
        noun = NOUN_SYNONYMS[ref.noun]
        adjective = ADJECTIVE_SYNONYMS[ref.adjective]
        templates = (
            f"{adjective.capitalize()} {noun} in {ref.colour}, {ref.material}",
            f"{ref.colour.capitalize()} {noun} ({adjective}, {ref.material} pattern)",
            f"{ref.material.capitalize()} {ref.colour} {adjective} {noun} remake",
        )
        fill = min(1.0, ref.mesh_fill * rng.uniform(0.98, 1.02))  # a near-copy of the mesh too
        values = {
            "title": templates[rng.integers(0, len(templates))],
            "description": f"{ref.colour.capitalize()} {noun} with a {ref.material} look, "
            f"great for any {ref.category} fan.",
            "mesh_fill": fill,
            "price": _price(ref.price * rng.uniform(0.4, 0.9)),  # knock-offs undercut the original
            "perturb_seed": int(rng.integers(0, 2**31)),
            "is_violation": True,
            "reference_item_id": int(ref.item_id),
        }
        for column in (
            "category",
            "category_idx",
            "noun",
            "adjective",
            "colour",
            "material",
            "render_seed",
            "mesh_sections",
        ):
            values[column] = ref[column]  # same look as the reference: the thumbnail is a near-copy
        for axis in ("bbox_x", "bbox_y", "bbox_z"):
            values[axis] = round(ref[axis] * rng.uniform(0.97, 1.03), 3)
        for column, value in values.items():
            items.at[row, column] = value
    items["prev_price"] = items["price"]


class World:
    """Deterministic world of a config; `at(k)` gives the state after day k and day k's changes."""

    CACHED_DAYS = 8

    def __init__(self, cfg: SimulatorConfig):
        self.cfg = cfg
        rng = rng_for(cfg.seed, INIT)
        self.cluster_affinity = make_cluster_affinity(rng, cfg.n_taste_clusters)
        self._initial = self._initial_state(rng)
        self.references = self._initial.items[self._initial.items.is_reference].copy()
        self._days: dict[int, tuple[Tables, Tables]] = {}

    def _initial_state(self, rng) -> Tables:
        """Everything that exists before start_date."""
        cfg = self.cfg
        start = day_start_us(cfg.start_date)
        signup = np.sort(start - rng.integers(US_PER_DAY, 730 * US_PER_DAY, cfg.n_users))
        users = _make_users(rng, cfg, 1, signup)

        # Creators join some time after signing up.
        chosen = np.sort(rng.choice(cfg.n_users, cfg.n_creators, replace=False))
        joined = signup[chosen] + (rng.random(cfg.n_creators) * 0.5 * (start - signup[chosen])).astype(np.int64)
        order = np.argsort(joined, kind="stable")
        creators = _make_creators(rng, 1, users.user_id.to_numpy()[chosen][order], joined[order])
        users.loc[chosen, "is_creator"] = True
        users.loc[chosen, "updated_at"] = joined

        # Items are created after their creator joined; ids follow creation time.
        weights = creators.productivity.to_numpy() / creators.productivity.sum()
        maker = rng.choice(cfg.n_creators, cfg.n_items, p=weights)
        joined_at = creators.joined_at.to_numpy()[maker]
        created = joined_at + (rng.random(cfg.n_items) * (start - joined_at)).astype(np.int64)
        order = np.argsort(created, kind="stable")
        items = _make_items(rng, 1, creators.creator_id.to_numpy()[maker][order], created[order])

        # References are among the oldest items, their variants among the newest.
        n = cfg.n_items
        references = rng.choice(int(n * 0.3), cfg.n_reference_items, replace=False)
        items.loc[references, "is_reference"] = True
        n_variants = min(round(cfg.violation_fraction * n), n - int(n * 0.5))
        variants = np.sort(rng.choice(np.arange(int(n * 0.5), n), n_variants, replace=False))
        _make_variants(rng, items, variants, items.loc[references], creators)
        return Tables(users, creators, items)

    def at(self, day_index: int) -> tuple[Tables, Tables]:
        """(state at the end of the day, rows new or changed that day); day 0 changes = everything."""
        if day_index < 0:
            raise ValueError("day is before start_date")
        if day_index not in self._days:
            last = max((k for k in self._days if k < day_index), default=-1)
            state = self._days[last][0] if last >= 0 else self._initial
            for k in range(last + 1, day_index + 1):
                self._days[k] = self._advance(state, k)
                state = self._days[k][0]
            for old in sorted(self._days)[: -self.CACHED_DAYS]:  # bound memory on long runs
                del self._days[old]
        return self._days[day_index]

    def _advance(self, state: Tables, k: int) -> tuple[Tables, Tables]:
        cfg = self.cfg
        rng = rng_for(cfg.seed, WORLD_DAY, k)
        start = day_start_us(cfg.start_date + timedelta(days=k))
        users, creators, items = state.users.copy(), state.creators.copy(), state.items.copy()

        def times(n: int) -> np.ndarray:
            return np.sort(start + rng.integers(0, US_PER_DAY, n))

        # Some existing users become creators (a changed users row plus a new creators row).
        candidates = np.flatnonzero(~users.is_creator.to_numpy() & (users.signup_at.to_numpy() < start))
        promoted = np.sort(rng.choice(candidates, min(cfg.new_creators_per_day, len(candidates)), replace=False))
        joined = times(len(promoted))
        users.loc[promoted, "is_creator"] = True
        users.loc[promoted, "updated_at"] = joined
        renamed = np.flatnonzero(rng.random(len(creators)) < cfg.creator_rename_fraction)
        creators.loc[renamed, "display_name"] = _display_names(rng, len(renamed))
        creators.loc[renamed, "updated_at"] = times(len(renamed))
        new_creators = _make_creators(rng, len(creators) + 1, users.user_id.to_numpy()[promoted], joined)

        new_users = _make_users(rng, cfg, len(users) + 1, times(cfg.new_users_per_day))

        repriced = np.flatnonzero(rng.random(len(items)) < cfg.price_change_fraction)
        items.loc[repriced, "prev_price"] = items.loc[repriced, "price"]
        new_price = items.loc[repriced, "price"].to_numpy() * rng.uniform(0.6, 1.3, len(repriced))
        items.loc[repriced, "price"] = _price(new_price)
        items.loc[repriced, "updated_at"] = times(len(repriced))

        # New items come from creators who joined before today.
        makers = creators[creators.joined_at < start]
        weights = makers.productivity.to_numpy() / makers.productivity.sum()
        n_new = cfg.new_items_per_day
        maker = makers.creator_id.to_numpy()[rng.choice(len(makers), n_new, p=weights)]
        new_items = _make_items(rng, len(items) + 1, maker, times(n_new))
        variants = np.flatnonzero(rng.random(n_new) < cfg.violation_fraction)
        _make_variants(rng, new_items, variants, self.references, makers)

        after = Tables(
            pd.concat([users, new_users], ignore_index=True),
            pd.concat([creators, new_creators], ignore_index=True),
            pd.concat([items, new_items], ignore_index=True),
        )
        if k == 0:
            return after, after
        changed = Tables(
            pd.concat([users.loc[promoted], new_users], ignore_index=True),
            pd.concat([creators.loc[renamed], new_creators], ignore_index=True),
            pd.concat([items.loc[repriced], new_items], ignore_index=True),
        )
        return after, changed
