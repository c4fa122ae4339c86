"""The demo's online experiment: its experiments file is one the server accepts, and the simulated
outcomes never replace a day of real interactions. (The whole flow runs in the README test's demo.)"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import polars as pl
import pytest
import yaml

from demo.online_experiment import SIMULATED, ab_with_shadow, refuse_real_interactions, write_outcomes
from engines.data.lake import Lake
from engines.experimentation.experiments import load_file

DAY = date(2026, 3, 4)


def test_the_experiments_file_is_valid_and_splits_users_in_half(tmp_path):
    path = tmp_path / "experiments.yaml"
    path.write_text(
        yaml.safe_dump(ab_with_shadow({"model_alias": "champion"}, {"model_version": 3}, {"model_version": 3}))
    )
    parsed = load_file(path)
    (experiment,) = parsed.experiments
    assert [v.traffic for v in experiment.variants] == [0.5, 0.5]
    assert [s.model_ref for s in parsed.shadows] == ["v3"]
    treated = sum(experiment.assign(user).name == "treatment" for user in range(4000))
    assert 1800 < treated < 2200


def interactions(event_ids: list[str]) -> pl.DataFrame:
    at = datetime(2026, 3, 4, 12, tzinfo=UTC)
    return pl.DataFrame({"event_id": event_ids, "event_timestamp": [at] * len(event_ids)})


def test_a_day_with_real_interactions_is_refused_and_one_of_simulated_outcomes_is_not(tmp_path):
    lake = Lake(tmp_path)
    refuse_real_interactions(lake, DAY)  # no interactions yet
    lake.write_partition("warehouse", "interactions", DAY, interactions([f"{SIMULATED}r1-1", f"{SIMULATED}r2-3"]))
    refuse_real_interactions(lake, DAY)
    lake.write_partition("warehouse", "interactions", DAY, interactions([f"{SIMULATED}r1-1", "e-17"]))
    with pytest.raises(RuntimeError, match="2026-03-04 has warehouse interactions"):
        refuse_real_interactions(lake, DAY)


def test_outcomes_after_midnight_land_on_the_next_day_and_complete_the_horizon(tmp_path):
    """An experiment run late in the day: the clicks after midnight belong to the next day's partition, and
    the day's monitoring then scores the late answers instead of leaving every one waiting."""
    from assets.monitoring import read_interactions
    from engines.experimentation.online_accuracy import with_complete_horizon
    from simulator.served_lists import INTERACTIONS

    lake, served = Lake(tmp_path), datetime(2026, 3, 4, 23, 50, tzinfo=UTC)
    times = [served + timedelta(minutes=m) for m in (3, 8, 15, 19)]  # two before midnight, two after
    rows = [{"event_id": f"{SIMULATED}r{k}", "event_timestamp": t, "user_id": k} for k, t in enumerate(times)]
    outcomes = pl.DataFrame(rows, schema=INTERACTIONS)
    write_outcomes(lake, DAY, outcomes)
    on_day = lake.read_partition("warehouse", "interactions", DAY)
    next_day = lake.read_partition("warehouse", "interactions", DAY + timedelta(days=1))
    assert on_day["event_timestamp"].to_list() == times[:2] and next_day["event_timestamp"].to_list() == times[2:]

    late_answer = pl.DataFrame({"served_at": [served], "role": ["live"], "endpoint": ["recommend"]})
    scored, waiting = with_complete_horizon(late_answer, read_interactions(lake, DAY)[1], timedelta(minutes=30))
    assert (scored.height, waiting) == (1, 0)

    # a day whose outcomes all fall on it leaves the next day's partition as it was
    earlier = outcomes.with_columns(pl.col("event_timestamp") - timedelta(days=1, hours=1))
    write_outcomes(lake, DAY - timedelta(days=1), earlier)
    assert lake.read_partition("warehouse", "interactions", DAY).height == 2
