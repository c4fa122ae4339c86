"""A short online experiment over a demo lake, as the demo and `examples/online_experiment.py` run it:
the model server answers recommend requests under an A/B test with a shadow, the simulator's users
react to the lists they were shown (`simulator.served_lists`: nobody real uses the server, so
the outcomes are synthetic), and the `online_monitoring` job takes the day's prediction log in and
scores every variant on those outcomes (`monitoring/online_accuracy`)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import polars as pl
import yaml

SIMULATED = "served-"  # event_id prefix of the simulated users' outcomes (simulator.served_lists)
MODEL = "personalization"


@dataclass(frozen=True)
class ExperimentResult:
    day: date
    answers_by_variant: dict[str, int]
    outcomes: int  # simulated clicks and plays
    accuracy: pl.DataFrame  # monitoring/online_accuracy of the day
    comparisons: pl.DataFrame  # monitoring/online_comparisons of the day


def ab_with_shadow(control: dict, treatment: dict, shadow: dict) -> dict:
    """An experiments file (deploy/experiments.yaml's shape): `control` against `treatment` for half the
    users each, and `shadow` answering a copy of every request off the response path. Each variant is
    `{"model_alias": ...}` or `{"model_version": ...}`."""
    return {
        "experiments": [
            {
                "name": "demo_ab",
                "model": MODEL,
                "salt": "demo-ab-1",
                "description": "two versions of the personalization model, half the users each",
                "variants": [
                    {"name": "control", **control, "traffic": 0.5},
                    {"name": "treatment", **treatment, "traffic": 0.5},
                ],
            }
        ],
        "shadows": [{"name": "shadow", "model": MODEL, **shadow}],
    }


def run_experiment(
    data_dir: Path,
    experiments: dict,
    requests: int,
    run_monitoring: Callable[[date], bool],
    seed: int = 7,
    say: Callable[[str], object] = print,
) -> ExperimentResult:
    """Serve `requests` recommendations to random users of the lake under `experiments`, simulate what
    the users did, then `run_monitoring(today)` (it materializes the online_monitoring job's assets)."""
    from engines.data.lake import Lake

    lake, today = Lake(data_dir), datetime.now(UTC).date()
    for day in (today, today + timedelta(days=1)):  # outcomes late in the day fall on the next one
        refuse_real_interactions(lake, day)
    users = lake.scan_partitions("warehouse", "users", lake.partition_days("warehouse", "users"))
    if users is None:
        raise RuntimeError(f"no users in {data_dir}: run the demo (scripts/demo) first")
    user_ids = sorted(users.select("user_id").unique().collect()["user_id"].to_list())
    path = Path(data_dir) / "serving" / "demo_experiments.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(experiments, sort_keys=False))
    variants = serve(data_dir, path, random.Random(seed).choices(user_ids, k=requests), say)
    say(f"   {requests} answers by variant {dict(variants)}; the shadow answered a copy of each, off the path")
    outcomes = simulate_outcomes(lake, data_dir, today, seed)
    say(f"   the simulated users clicked or played {outcomes} times after them (synthetic outcomes)")
    if not run_monitoring(today):
        raise RuntimeError("the online_monitoring run failed; see `mlplane ui`")
    return ExperimentResult(
        today,
        dict(variants),
        outcomes,
        lake.read_partition("monitoring", "online_accuracy", today),
        lake.read_partition("monitoring", "online_comparisons", today),
    )


def refuse_real_interactions(lake, day: date) -> None:
    """The simulated outcomes replace the day's warehouse interactions: refuse a day with real ones."""
    if not lake.partition_path("warehouse", "interactions", day).exists():
        return
    ids = lake.read_partition("warehouse", "interactions", day)["event_id"]
    if not ids.str.starts_with(SIMULATED).all():
        raise RuntimeError(f"{day} has warehouse interactions: the simulated outcomes would replace them")


def serve(data_dir: Path, experiments_file: Path, users: list[int], say) -> Counter:
    import httpx

    from serving.models.background import running_model_server
    from serving.models.config import ServerConfig

    config = ServerConfig.local(data_dir, experiments_file=str(experiments_file), feature_log_sample=0.0)
    config.models = [m for m in config.models if m.kind == "two_tower"]  # recommend only: no CLIP needed
    variants: Counter = Counter()
    with running_model_server(config) as url, httpx.Client(base_url=url, timeout=60) as client:
        say(f"   model server at {url} with {experiments_file}")
        for user in users:
            answer = client.post("/recommend", json={"user_id": user, "k": 10})
            answer.raise_for_status()
            variants[answer.json()["variant"]] += 1
    return variants  # leaving the block stopped the server cleanly: every answer is in the prediction log


def simulate_outcomes(lake, data_dir: Path, day: date, seed: int) -> int:
    """The simulated users' clicks and plays after every live answer of the day so far, written as the
    warehouse interactions of the days they happen on (all of them again, so a second experiment on the day
    adds to the first)."""
    from engines.experimentation.prediction_logs import read_spool
    from simulator import SimulatorConfig
    from simulator.answer_key import AnswerKey
    from simulator.served_lists import outcomes_of

    logged = read_spool(data_dir, day).filter(pl.col("role") == "live").sort("served_at", "request_id")
    key = AnswerKey.on(SimulatorConfig.load(Path(data_dir) / "sim_truth" / "simulator_config.json"), day)
    outcomes = outcomes_of(logged, key, seed)
    write_outcomes(lake, day, outcomes)
    return outcomes.height


def write_outcomes(lake, day: date, outcomes: pl.DataFrame) -> None:
    """`outcomes` into the interactions partitions of their own days: those of answers served near midnight
    fall on the next day, and the day's monitoring reads them from there (answers whose horizon ends past
    the day's interactions wait for the next day's)."""
    for when in (day, day + timedelta(days=1)):
        on_day = outcomes.filter(pl.col("event_timestamp").dt.date() == when)
        if when == day or not on_day.is_empty():
            lake.write_partition("warehouse", "interactions", when, on_day)


ACCURACY_COLUMNS = ["role", "variant", "model_version", "users", "answers", "ctr", "ctr_low", "ctr_high", "ndcg"]
COMPARISON_COLUMNS = [  # a shadow has no p-value: its agreement with the live version is shown instead
    "experiment",
    "variant",
    "metric",
    "control_versions",
    "variant_versions",
    "difference",
    "cuped_difference",
    "adjusted_p_value",  # group sequential over the pooled days, Holm over variants x metrics
    "test",  # why an A/B row has no p-value (an arm under minimum_users)
    "users_needed_per_arm",
    "overlap_at_k",
    "rank_correlation",
]


def table_text(frame: pl.DataFrame, columns: list[str]) -> str:
    shown = frame.select([c for c in columns if c in frame.columns])
    with pl.Config(tbl_cols=20, tbl_width_chars=160, tbl_hide_dataframe_shape=True, float_precision=4):
        return str(shown)
