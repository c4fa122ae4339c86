"""One day of marketplace events (interactions, chat, abuse reports), generated in memory.

`generate_day_events` is a pure function of (world state, day, rng); writers and the future
streaming appender both use it.
"""

from dataclasses import dataclass
from datetime import date

import numpy as np
import pyarrow as pa

from .config import SimulatorConfig
from .files import SCHEMAS, TIMESTAMP
from .vocabulary import ABUSIVE_MESSAGES, DEVICE_WEIGHTS, DEVICES, NORMAL_MESSAGES
from .world import US_PER_SECOND, Tables, day_start_us

# Sessions start early enough that the whole funnel (at most ~65 min) ends before midnight.
SESSION_LATEST_START_S = 86_400 - 7_200
SESSION_LENGTH_S = 1_800
MAX_PLAY_S = 1_800
# Chat messages and abuse reports stay before 23:00 so that follow-up reports stay in the day.
CHAT_LATEST_S = 86_400 - 3_600

IMPRESSION_AFFINITY = 0.7  # how strongly the feed already targets a user's taste
EVENT_TYPES = np.array(["impression", "click", "play", "purchase"])


@dataclass
class DayEvents:
    interactions: pa.Table
    chat_messages: pa.Table
    abuse_reports: pa.Table
    chat_truth: pa.Table  # message_id, is_abusive


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def click_logit(log_affinity, pop_z):
    """The simulated users' click model: P(click | shown) = sigmoid(click_logit), from the taste of the
    user's cluster for the item's category and the item's latent popularity."""
    return -3.3 + 0.8 * log_affinity + 0.3 * pop_z


def play_logit(log_affinity):
    """P(play | clicked) = sigmoid(play_logit): a user plays what matches their taste more often."""
    return -0.4 + 0.6 * log_affinity


def _seconds(rng, low: float, high: float, n: int) -> np.ndarray:
    """Random durations in microseconds."""
    return rng.integers(int(low * US_PER_SECOND), int(high * US_PER_SECOND), n)


def _nullable_ids(ids: np.ndarray, valid: np.ndarray) -> pa.Array:
    return pa.array(ids.astype(np.int64), mask=~valid, type=pa.int64())


def _impressions(rng, cfg, state: Tables, affinity, active: np.ndarray, start: int, volume: float) -> dict:
    users, items = state.users, state.items
    n_impressions = rng.poisson(cfg.impressions_per_user_day * volume * users.activity.to_numpy()[active])
    n_sessions = np.minimum(1 + rng.poisson(0.5, len(active)), np.maximum(n_impressions, 1))
    owner = np.repeat(np.arange(len(active)), n_impressions)  # position in `active`
    session = (rng.random(len(owner)) * n_sessions[owner]).astype(np.int64)
    max_sessions = int(n_sessions.max(initial=1))
    session_start = _seconds(rng, 0, SESSION_LATEST_START_S, len(active) * max_sessions).reshape(-1, max_sessions)
    ts = start + session_start[owner, session] + _seconds(rng, 0, SESSION_LENGTH_S, len(owner))
    usual_device = users.device.to_numpy()[active][:, None]
    other_device = DEVICES[rng.choice(len(DEVICES), (len(active), max_sessions), p=DEVICE_WEIGHTS)]
    session_device = np.where(rng.random((len(active), max_sessions)) < 0.85, usual_device, other_device)

    # Popular items and items of the user's taste are shown more; items not yet created are not.
    cluster = users.taste_cluster.to_numpy()[active][owner]
    created = items.created_at.to_numpy()
    weights = np.exp(1.5 * items.pop_z.to_numpy()) * affinity[:, items.category_idx.to_numpy()] ** IMPRESSION_AFFINITY
    item = np.zeros(len(owner), dtype=np.int64)
    for c in range(len(affinity)):
        rows = np.flatnonzero(cluster == c)
        item[rows] = rng.choice(len(items), len(rows), p=weights[c] / weights[c].sum())
        too_new = rows[created[item[rows]] > ts[rows]]
        existing = weights[c] * (created < start)
        item[too_new] = rng.choice(len(items), len(too_new), p=existing / existing.sum())
    return {
        "user": active[owner],
        "item": item,
        "ts": ts,
        "session": session,
        "device": session_device[owner, session],
        "cluster": cluster,
    }


def _interactions(rng, state: Tables, affinity, imp: dict, prefix: str) -> pa.Table:
    items = state.items
    n = len(imp["ts"])
    log_affinity = np.log(affinity[imp["cluster"], items.category_idx.to_numpy()[imp["item"]]])
    pop_z = items.pop_z.to_numpy()[imp["item"]]

    clicks = np.flatnonzero(rng.random(n) < _sigmoid(click_logit(log_affinity, pop_z)))
    click_ts = imp["ts"][clicks] + _seconds(rng, 1, 20, len(clicks))
    played = rng.random(len(clicks)) < _sigmoid(play_logit(log_affinity[clicks]))
    plays, play_ts = clicks[played], click_ts[played] + _seconds(rng, 2, 30, int(played.sum()))
    play_seconds = np.round(np.clip(rng.lognormal(np.log(90), 1.0, len(plays)), 1, MAX_PLAY_S), 3)
    bought = rng.random(len(plays)) < _sigmoid(-2.3 + 0.6 * log_affinity[plays])
    purchases = plays[bought]
    play_end = play_ts[bought] + (play_seconds[bought] * US_PER_SECOND).astype(np.int64)
    purchase_ts = play_end + _seconds(rng, 5, 120, len(purchases))
    # The price paid is the one in force at purchase time (an item may be repriced today).
    bought_item = imp["item"][purchases]
    paid = np.where(
        purchase_ts >= items.updated_at.to_numpy()[bought_item],
        items.price.to_numpy()[bought_item],
        items.prev_price.to_numpy()[bought_item],
    )

    source = np.concatenate([np.arange(n), clicks, plays, purchases])
    kind = np.repeat(np.arange(4), [n, len(clicks), len(plays), len(purchases)])
    ts = np.concatenate([imp["ts"], click_ts, play_ts, purchase_ts])
    nan = np.full(len(source), np.nan)
    seconds, amount = nan.copy(), nan.copy()
    seconds[kind == 2] = play_seconds
    amount[kind == 3] = paid
    order = np.lexsort((kind, ts))
    source, kind, ts, seconds, amount = source[order], kind[order], ts[order], seconds[order], amount[order]

    user_id = state.users.user_id.to_numpy()[imp["user"][source]]
    session_id = [f"s-{prefix}-{u}-{s}" for u, s in zip(user_id, imp["session"][source])]
    return pa.table(
        {
            "event_id": [f"ev-{prefix}-{i:07d}" for i in range(len(source))],
            "event_timestamp": pa.array(ts, type=TIMESTAMP),
            "user_id": user_id,
            "item_id": items.item_id.to_numpy()[imp["item"][source]],
            "event_type": EVENT_TYPES[kind],
            "session_id": session_id,
            "device": imp["device"][source],
            "play_seconds": pa.array(seconds, from_pandas=True),
            "amount": pa.array(amount, from_pandas=True),
        },
        schema=SCHEMAS["interactions"],
    )


def _creator_user(state: Tables, item: np.ndarray) -> np.ndarray:
    """Row position in users of each item's creator."""
    creator_user_id = state.creators.user_id.to_numpy()[state.items.creator_id.to_numpy()[item] - 1]
    return creator_user_id - 1


def _other_active(rng, active: np.ndarray, position: np.ndarray) -> np.ndarray:
    """For each position in `active`, a random other active user (never the same one)."""
    return active[(position + rng.integers(1, max(len(active), 2), len(position))) % len(active)]


def _chat(rng, cfg, state: Tables, active: np.ndarray, start: int, volume: float, prefix: str) -> dict:
    users, items = state.users, state.items
    abuser = users.is_abuser.to_numpy()
    n_messages = rng.poisson(cfg.chat_messages_per_user_day * volume * np.where(abuser[active], 4.0, 1.0))
    position = np.repeat(np.arange(len(active)), n_messages)
    sender = active[position]
    m = len(sender)
    ts = start + _seconds(rng, 0, CHAT_LATEST_S, m)

    # Half of the messages ask an item's creator about the item, the rest go to other users.
    popularity = np.exp(1.5 * items.pop_z.to_numpy()) * (items.created_at.to_numpy() < start)
    item = rng.choice(len(items), m, p=popularity / popularity.sum())
    creator = _creator_user(state, item)
    about_item = (rng.random(m) < 0.5) & (creator != sender)
    receiver = np.where(about_item, creator, _other_active(rng, active, position))
    abusive = rng.random(m) < np.where(abuser[sender], 0.6, 0.003)

    pick = rng.random(m)
    words = items[["noun", "colour", "category"]].to_numpy()[item]
    text = []
    for bad, about, p, (noun, colour, category) in zip(abusive, about_item, pick, words):
        templates = (ABUSIVE_MESSAGES if bad else NORMAL_MESSAGES)[bool(about)]
        text.append(templates[int(p * len(templates))].format(noun=noun, colour=colour, category=category))
    order = np.argsort(ts, kind="stable")
    return {
        "message_id": np.array([f"msg-{prefix}-{i:06d}" for i in range(m)], dtype=object),
        "ts": ts[order],
        "sender": sender[order],
        "receiver": receiver[order],
        "item": item[order],
        "about_item": about_item[order],
        "text": np.array(text, dtype=object)[order],
        "abusive": abusive[order],
    }


def _reports(
    rng, state: Tables, active: np.ndarray, imp: dict, chat: dict, start: int, volume: float, prefix: str
) -> pa.Table:
    users, items = state.users, state.items
    parts = []  # (ts, reporter, reported, item, has_item, reason)

    # Receivers of abusive messages report some of them.
    hit = np.flatnonzero(chat["abusive"] & (rng.random(len(chat["ts"])) < 0.35))
    parts.append(
        (
            chat["ts"][hit] + _seconds(rng, 30, 1_800, len(hit)),
            chat["receiver"][hit],
            chat["sender"][hit],
            chat["item"][hit],
            chat["about_item"][hit],
            rng.choice(["harassment", "inappropriate"], len(hit), p=[0.7, 0.3]),
        )
    )

    # Abusers also get reported for spam and scams.
    abusers = np.flatnonzero(users.is_abuser.to_numpy()[active])
    hit = abusers[rng.random(len(abusers)) < min(1.0, 0.15 * volume)]
    parts.append(
        (
            start + _seconds(rng, 0, CHAT_LATEST_S, len(hit)),
            _other_active(rng, active, hit),
            active[hit],
            np.zeros(len(hit), dtype=np.int64),
            np.zeros(len(hit), dtype=bool),
            rng.choice(["spam", "scam"], len(hit)),
        )
    )

    # Viewers flag copies: violating items are reported far more often than others.
    is_violation = items.is_violation.to_numpy()[imp["item"]]
    hit = np.flatnonzero(rng.random(len(imp["ts"])) < np.where(is_violation, 0.01, 0.0003))
    parts.append(
        (
            imp["ts"][hit] + _seconds(rng, 10, 600, len(hit)),
            imp["user"][hit],
            _creator_user(state, imp["item"][hit]),
            imp["item"][hit],
            np.ones(len(hit), dtype=bool),
            np.full(len(hit), "ip_violation"),
        )
    )

    # Background noise: unfounded reports between random users.
    position = rng.integers(0, len(active), rng.poisson(0.002 * len(active) * volume))
    parts.append(
        (
            start + _seconds(rng, 0, CHAT_LATEST_S, len(position)),
            active[position],
            _other_active(rng, active, position),
            np.zeros(len(position), dtype=np.int64),
            np.zeros(len(position), dtype=bool),
            rng.choice(["spam", "harassment", "scam", "inappropriate"], len(position)),
        )
    )

    ts, reporter, reported, item, has_item, reason = (np.concatenate(column) for column in zip(*parts))
    keep = reporter != reported
    order = np.argsort(ts[keep], kind="stable")
    ts, reporter, reported = ts[keep][order], reporter[keep][order], reported[keep][order]
    item, has_item, reason = item[keep][order], has_item[keep][order], reason[keep][order]
    user_id, item_id = users.user_id.to_numpy(), items.item_id.to_numpy()
    return pa.table(
        {
            "report_id": [f"rp-{prefix}-{i:06d}" for i in range(len(ts))],
            "event_timestamp": pa.array(ts, type=TIMESTAMP),
            "reporter_id": user_id[reporter],
            "reported_user_id": user_id[reported],
            "item_id": _nullable_ids(item_id[item], has_item),
            "reason": reason.astype(str),
        },
        schema=SCHEMAS["abuse_reports"],
    )


def generate_day_events(
    cfg: SimulatorConfig,
    state: Tables,
    affinity: np.ndarray,
    day: date,
    rng: np.random.Generator,
    volume: float = 1.0,
    id_tag: str = "",
) -> DayEvents:
    """All events of `day` given the world state at the end of that day.

    `volume` scales the amount of activity (late files use a small share of a day); `id_tag`
    keeps ids of extra batches apart from the day's main ids.
    """
    start = day_start_us(day)
    prefix = f"{day:%Y%m%d}{id_tag}"
    signed_up = state.users.signup_at.to_numpy() < start  # today's sign-ups start tomorrow
    active = np.flatnonzero(signed_up & (rng.random(len(state.users)) < cfg.daily_active_fraction))

    imp = _impressions(rng, cfg, state, affinity, active, start, volume)
    interactions = _interactions(rng, state, affinity, imp, prefix)
    chat = _chat(rng, cfg, state, active, start, volume, prefix)
    reports = _reports(rng, state, active, imp, chat, start, volume, prefix)
    user_id, item_id = state.users.user_id.to_numpy(), state.items.item_id.to_numpy()
    chat_messages = pa.table(
        {
            "message_id": chat["message_id"],
            "event_timestamp": pa.array(chat["ts"], type=TIMESTAMP),
            "sender_id": user_id[chat["sender"]],
            "receiver_id": user_id[chat["receiver"]],
            "item_id": _nullable_ids(item_id[chat["item"]], chat["about_item"]),
            "text": chat["text"],
        },
        schema=SCHEMAS["chat_messages"],
    )
    chat_truth = pa.table({"message_id": chat["message_id"], "is_abusive": chat["abusive"]})
    return DayEvents(interactions, chat_messages, reports, chat_truth)
