"""A short A/B test with a shadow through the model server, then its online-accuracy table.

    .venv/bin/python examples/online_experiment.py [--data-dir DIR] [--requests 400]

Needs a lake where the personalization model has a `champion` and a `challenger` (the training job
registers them). Steps:
1. starts the model server in this process over the lake with an experiments file: `champion` against
   `challenger` 50/50, and version 1 as a shadow;
2. sends `--requests` recommend requests for random users of the lake;
3. stops the server (every answer is in the prediction log) and SIMULATES what the users did next with
   the simulator's own users (`engines.simulator.answer_key`): a user looks at the item at rank r with
   probability 1/log2(r + 1) and clicks it with the probability the simulator gives that user and item,
   then may play it. Nobody else uses the demo's server, so the outcomes are synthetic, but a variant
   whose lists suit the users' tastes better gets more clicks. They are written as the day's warehouse
   interactions, so a day that already has interactions is refused;
4. materializes `serving/prediction_logs` and `monitoring/online_accuracy` for today with Dagster and
   prints the tables the asset's metadata carries.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import polars as pl
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.lake import Lake  # noqa: E402
from engines.prediction_logs import read_spool  # noqa: E402
from engines.simulator import SimulatorConfig  # noqa: E402
from engines.simulator.answer_key import AnswerKey  # noqa: E402
from orchestration.profiles import local_data_dir  # noqa: E402
from serving.models.background import running_model_server  # noqa: E402
from serving.models.config import ServerConfig  # noqa: E402

EXPERIMENTS = {
    "experiments": [
        {
            "name": "demo_ab",
            "model": "personalization",
            "salt": "demo-ab-1",
            "description": "champion against challenger, half the users each",
            "variants": [
                {"name": "control", "model_alias": "champion", "traffic": 0.5},
                {"name": "treatment", "model_alias": "challenger", "traffic": 0.5},
            ],
        }
    ],
    "shadows": [{"name": "first_version", "model": "personalization", "model_version": 1}],
}


def simulate_outcomes(answers: pl.DataFrame, key: AnswerKey, seed: int) -> pl.DataFrame:
    """Clicks and plays of the simulated users after each live answer (see the module's docstring)."""
    rng, rows = random.Random(seed), []
    for answer in answers.iter_rows(named=True):
        user = answer["user_id"]
        for rank, item in enumerate(answer["item_ids"], start=1):
            if rng.random() < key.click_probability(user, item) / math.log2(rank + 1):
                at = answer["served_at"] + timedelta(minutes=rng.uniform(0.5, 20))
                rows.append(
                    {
                        "event_id": f"demo-{len(rows)}",
                        "event_timestamp": at,
                        "user_id": answer["user_id"],
                        "item_id": item,
                        "event_type": "click",
                        "session_id": answer["request_id"],
                        "device": "web",
                        "play_seconds": None,
                        "amount": None,
                    }
                )
                if rng.random() < key.play_probability(user, item):
                    rows.append(
                        {
                            **rows[-1],
                            "event_id": f"demo-{len(rows)}",
                            "event_type": "play",
                            "event_timestamp": at + timedelta(seconds=5),
                            "play_seconds": 30.0,
                        }
                    )
    return pl.DataFrame(
        rows,
        schema={
            "event_id": pl.String,
            "event_timestamp": pl.Datetime("us", "UTC"),
            "user_id": pl.Int64,
            "item_id": pl.Int64,
            "event_type": pl.String,
            "session_id": pl.String,
            "device": pl.String,
            "play_seconds": pl.Float64,
            "amount": pl.Float64,
        },
    )


def materialize_today(data_dir: Path, day) -> None:
    from dagster import AssetKey, DagsterInstance, materialize

    from assets import all_asset_checks, all_assets
    from orchestration.profiles import resources_for

    keys = [AssetKey(["serving", "prediction_logs"]), AssetKey(["monitoring", "online_accuracy"])]
    result = materialize(
        [*all_assets, *all_asset_checks],
        selection=keys,
        partition_key=day.isoformat(),
        resources=resources_for("local", data_dir=str(data_dir)),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    if not result.success:
        raise SystemExit("materializing the prediction logs and online accuracy failed; see the log above")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=local_data_dir())
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    data_dir, rng = Path(args.data_dir), random.Random(args.seed)
    lake, today = Lake(data_dir), datetime.now(UTC).date()
    if lake.partition_path("warehouse", "interactions", today).exists():
        raise SystemExit(f"{today} already has warehouse interactions: the simulated outcomes would replace them")
    users = lake.scan_partitions("warehouse", "users", lake.partition_days("warehouse", "users"))
    if users is None:
        raise SystemExit(f"no users in {data_dir}: run the demo (scripts/demo) first")
    user_ids = users.select("user_id").unique().collect()["user_id"].to_list()
    experiments = data_dir / "serving" / "demo_experiments.yaml"
    experiments.parent.mkdir(parents=True, exist_ok=True)
    experiments.write_text(yaml.safe_dump(EXPERIMENTS, sort_keys=False))

    config = ServerConfig.local(data_dir, experiments_file=str(experiments), feature_log_sample=0.0)
    config.models = [m for m in config.models if m.kind == "two_tower"]  # recommend only: no CLIP needed
    with running_model_server(config) as url, httpx.Client(base_url=url, timeout=60) as client:
        print(f"1/3 model server at {url}, experiments {experiments}")
        print(f"    experiments in use: {client.get('/v2/experiments').json()}")
        variants = {}
        for _ in range(args.requests):
            answer = client.post("/recommend", json={"user_id": rng.choice(user_ids), "k": 10})
            answer.raise_for_status()
            variants[answer.json()["variant"]] = variants.get(answer.json()["variant"], 0) + 1
    # leaving the block stopped the server cleanly: shadows finished, the prediction log is written
    print(f"2/3 {args.requests} answers by variant {variants}; shadow answers logged beside them")
    logged = read_spool(data_dir, today).filter(pl.col("role") == "live")
    key = AnswerKey.on(SimulatorConfig.load(data_dir / "sim_truth" / "simulator_config.json"), today)
    lake.write_partition("warehouse", "interactions", today, simulate_outcomes(logged, key, args.seed))
    print("3/3 simulated outcomes written; materializing serving/prediction_logs and monitoring/online_accuracy")
    materialize_today(data_dir, today)
    pl.Config.set_tbl_cols(20)
    pl.Config.set_tbl_width_chars(200)
    columns = [
        "role",
        "variant",
        "model_version",
        "users",
        "answers",
        "ctr",
        "ctr_low",
        "ctr_high",
        "ndcg",
        "calibration",
    ]
    print(lake.read_partition("monitoring", "online_accuracy", today).select(columns))
    print(
        lake.read_partition("monitoring", "online_comparisons", today).select(
            "experiment",
            "control",
            "variant",
            "control_ctr",
            "variant_ctr",
            "difference",
            "p_value",
            "users_still_needed",
            "counterfactual",
        )
    )


if __name__ == "__main__":
    main()
