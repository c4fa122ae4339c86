"""The simulated users' reaction to lists a model server showed them: for the demo's and the example's
A/B tests, where nobody real uses the server. A user looks at the item at rank r with probability
1/log2(r + 1) and clicks it with the probability the simulator's world gives that user and item
(`AnswerKey`), then may play it. A variant whose lists suit the users' tastes gets more clicks."""

from __future__ import annotations

import math
import random
from datetime import timedelta

import polars as pl

from .answer_key import AnswerKey
from .files import SCHEMAS

INTERACTIONS = pl.Schema(pl.DataFrame(SCHEMAS["interactions"].empty_table()).schema)


def outcomes_of(answers: pl.DataFrame, key: AnswerKey, seed: int) -> pl.DataFrame:
    """Clicks and plays (interactions rows) after each answer of `answers` (prediction-log rows with
    request_id, served_at, user_id, item_ids), within 20 minutes of it."""
    rng, rows = random.Random(seed), []
    for answer in answers.iter_rows(named=True):
        user = answer["user_id"]
        for rank, item in enumerate(answer["item_ids"] or [], start=1):
            if rng.random() >= key.click_probability(user, item) / math.log2(rank + 1):
                continue
            at = answer["served_at"] + timedelta(minutes=rng.uniform(0.5, 20))
            click = {
                "event_id": f"served-{answer['request_id']}-{rank}",
                "event_timestamp": at,
                "user_id": user,
                "item_id": item,
                "event_type": "click",
                "session_id": answer["request_id"],
                "device": "web",
                "play_seconds": None,
                "amount": None,
            }
            rows.append(click)
            if rng.random() < key.play_probability(user, item):
                rows.append(
                    click
                    | {
                        "event_id": f"{click['event_id']}-play",
                        "event_type": "play",
                        "event_timestamp": at + timedelta(seconds=5),
                        "play_seconds": 30.0,
                    }
                )
    return pl.DataFrame(rows, schema=INTERACTIONS)
