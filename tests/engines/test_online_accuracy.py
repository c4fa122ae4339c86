"""Online accuracy against an independent recomputation: random prediction logs and interactions, each
metric recomputed with plain Python loops from the raw rows (hits within the horizon, NDCG,
delta-method intervals over users, z-tests, sample sizes)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.stats import chisquare

from engines.experimentation.experiments import assignments, load
from engines.experimentation.online_accuracy import (
    AccuracySettings,
    by_experiment,
    by_model,
    chi_square,
    credited_outcomes,
    drops,
    experiment_users,
    online_verdict,
    pooled_sample_ratio,
    sample_ratio,
    scored_answers,
    shadow_against_live,
    srm_test,
    with_complete_horizon,
    with_sample_ratio,
)
from engines.experimentation.prediction_logs import LIVE, SHADOW, PredictionRecord, frame

T0 = datetime(2026, 3, 2, 8, tzinfo=UTC)
SETTINGS = AccuracySettings(k=5, horizon=timedelta(minutes=30))
Z95 = 1.959963984540054


def simulated(seed: int, users: int = 300, lift: float = 0.0):
    """Live answers of an A/B test (control v1, treatment v2), a shadow (v3) beside each, and the clicks
    and plays that followed (some outside the horizon, some of items never shown, some impressions)."""
    rng = random.Random(seed)
    records, events = [], []
    for n in range(users * 3):
        user = rng.randrange(users)
        arm = "treatment" if (user * 7919) % 2 else "control"
        other = "b" if (user * 104729) % 3 else "a"
        at = T0 + timedelta(seconds=rng.randrange(6 * 3600))
        items = rng.sample(range(500), rng.choice([5, 5, 5, 3, 7]))
        scores = sorted((rng.gauss(-2, 1) for _ in items), reverse=True)
        request = f"r{n}"
        assignments = {"ab": arm, "other": other}
        records.append(
            PredictionRecord(
                request,
                at,
                LIVE,
                "recommend",
                user,
                "ab",
                arm,
                assignments,
                "personalization" if arm == "control" else "personalization-challenger",
                "personalization",
                "1" if arm == "control" else "2",
                5,
                "0" * 64,
                rng.random() * 10,
                items,
                scores,
            )
        )
        shadow_items = items[:2] + rng.sample(range(500), 3)
        shadow_scores = sorted((rng.gauss(-2, 1) for _ in range(5)), reverse=True)
        records.append(
            PredictionRecord(
                request,
                at,
                SHADOW,
                "recommend",
                user,
                "",
                "slow",
                assignments,
                "personalization@slow",
                "personalization",
                "3",
                5,
                "0" * 64,
                rng.random() * 20,
                shadow_items,
                shadow_scores,
            )
        )
        p = 0.15 + (lift if arm == "treatment" else 0.0)
        for rank, item in enumerate(items):
            if rng.random() < p / (rank + 1) ** 0.5:
                kind = rng.choice(["click", "play", "impression"])
                delay = timedelta(minutes=rng.choice([1, 10, 29, 31, 90]))
                echoed = rng.choice([request, f"r{rng.randrange(n + 1)}", None, None])  # some clients echo
                events.append(
                    {
                        "user_id": user,
                        "item_id": item,
                        "event_type": kind,
                        "event_timestamp": at + delay,
                        "session_id": echoed,
                    }
                )
        events.append(
            {
                "user_id": user,
                "item_id": rng.randrange(500),
                "event_type": "click",
                "event_timestamp": at - timedelta(minutes=5),
                "session_id": None,
            }
        )  # before the answer: never a hit
    records.append(
        PredictionRecord(
            "failed",
            T0,
            SHADOW,
            "recommend",
            1,
            "",
            "broken",
            {},
            "x",
            "personalization",
            "",
            5,
            "0" * 64,
            1.0,
            status="error",
            error="boom",
        )
    )
    interactions = pl.DataFrame(
        events,
        schema={
            "user_id": pl.Int64,
            "item_id": pl.Int64,
            "event_type": pl.String,
            "event_timestamp": pl.Datetime("us", "UTC"),
            "session_id": pl.String,
        },
    )
    return records, interactions


def credit(records, interactions, horizon=SETTINGS.horizon) -> dict[int, tuple[str, int]]:
    """Outcome row -> (request id, item) of the one answer it is credited to, written plainly: of the live
    answers that showed the item to the user within the horizon before the outcome, the one whose request
    id the interaction echoes, else the last (ties: the greater request id)."""
    live_by_user = defaultdict(list)
    for r in records:
        if r.role == LIVE and r.status == "ok":
            live_by_user[r.user_id].append(r)
    credited = {}
    for row, e in enumerate(interactions.iter_rows(named=True)):
        if e["event_type"] not in ("click", "play"):
            continue
        at = e["event_timestamp"]
        showed = [
            r
            for r in live_by_user[e["user_id"]]
            if e["item_id"] in r.item_ids and r.served_at <= at <= r.served_at + horizon
        ]
        if not showed:
            continue
        echoed = [r for r in showed if r.request_id == e["session_id"]]
        chosen = echoed[0] if echoed else max(showed, key=lambda r: (r.served_at, r.request_id))
        credited[row] = (chosen.request_id, e["item_id"])
    return credited


def recompute(records, interactions):
    """Per record: hits, shown and NDCG at k, from the raw rows with loops."""
    credited = set(credit(records, interactions).values())
    out = []
    for r in records:
        if r.status != "ok":
            continue
        hits, dcg = [], 0.0
        for rank, item in enumerate(r.item_ids[:5], start=1):
            hit = (r.request_id, item) in credited
            hits.append(hit)
            dcg += hit / math.log2(rank + 1)
        ideal = sum(1 / math.log2(i + 1) for i in range(1, sum(hits) + 1))
        out.append(
            {
                "record": r,
                "hits": sum(hits),
                "shown": len(hits),
                "ndcg": dcg / ideal if ideal else 0.0,
            }
        )
    return out


def ratio_and_se(units: dict) -> tuple[float, float]:
    """Σa/Σb over units with the delta-method standard error, from (a, b) pairs per unit."""
    pairs = list(units.values())
    a, b = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    value, mean_b, u = a / b, b / len(pairs), len(pairs)
    residuals = [p[0] - value * p[1] for p in pairs]
    mean_r = sum(residuals) / u
    variance = sum((r - mean_r) ** 2 for r in residuals) / (u - 1)
    return value, math.sqrt(variance / u) / mean_b


def test_metrics_per_model_version_match_a_recomputation_from_the_raw_rows():
    records, interactions = simulated(3)
    answers = scored_answers(frame(records), interactions, SETTINGS)
    table = by_model(answers, SETTINGS)
    truth = recompute(records, interactions)
    assert table["answers"].sum() == len(truth)
    for row in table.iter_rows(named=True):
        mine = [
            t
            for t in truth
            if (t["record"].role, t["record"].model_version, t["record"].variant)
            == (row["role"], row["model_version"], row["variant"])
        ]
        users = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for t in mine:
            u = users[t["record"].user_id]
            u[0] += t["hits"]
            u[1] += t["shown"]
            u[2] += t["ndcg"]
            u[3] += 1
        ctr, ctr_se = ratio_and_se({k: (v[0], v[1]) for k, v in users.items()})
        ndcg, ndcg_se = ratio_and_se({k: (v[2], v[3]) for k, v in users.items()})
        assert row["users"] == len(users) and row["hits"] == sum(v[0] for v in users.values())
        assert "calibration" not in row  # the score's sigmoid is no click probability: no such figure
        for name, value, se in (("ctr", ctr, ctr_se), ("ndcg", ndcg, ndcg_se)):
            assert row[name] == pytest.approx(value, rel=1e-9)
            assert row[f"{name}_low"] == pytest.approx(value - Z95 * se, rel=1e-9)
            assert row[f"{name}_high"] == pytest.approx(value + Z95 * se, rel=1e-9)
        assert row["counterfactual"] == (row["role"] == SHADOW)
    assert table.filter(pl.col("variant") == "broken").is_empty()  # a failed shadow showed nothing


def pooled(records, interactions, controls, settings=SETTINGS, covariates=None):
    """by_experiment over one day of answers."""
    answers = scored_answers(frame(records), interactions, settings)
    return by_experiment(experiment_users(answers, T0.date()), controls, settings, covariates)


def test_experiment_differences_tests_and_sample_sizes_match_a_recomputation():
    records, interactions = simulated(5, users=400, lift=0.1)
    table = pooled(records, interactions, {"ab": "control", "other": "a"})
    truth = [t for t in recompute(records, interactions) if t["record"].role == LIVE]
    assert sorted(set(table["experiment"].to_list())) == ["ab", "other"]
    assert sorted(table["metric"].to_list()) == sorted(["ctr", "ndcg", "hits_per_user"] * 2)
    for row in table.filter(pl.col("metric") == "ctr").iter_rows(named=True):
        arms = {}
        for arm in (row["control"], row["variant"]):
            users = defaultdict(lambda: [0.0, 0.0])
            for t in truth:
                if t["record"].assignments[row["experiment"]] == arm:
                    users[t["record"].user_id][0] += t["hits"]
                    users[t["record"].user_id][1] += t["shown"]
            arms[arm] = (*ratio_and_se(users), len(users))
        (c, c_se, c_n), (v, v_se, v_n) = arms[row["control"]], arms[row["variant"]]
        se = math.sqrt(c_se**2 + v_se**2)
        p = math.erfc(abs(v - c) / se / math.sqrt(2))
        needed = math.ceil((Z95 + 0.8416212335729143) ** 2 * (c_se**2 * c_n + v_se**2 * v_n) / (0.05 * c) ** 2)
        assert (row["control_users"], row["variant_users"], row["looks"]) == (c_n, v_n, 1)
        assert row["difference"] == pytest.approx(v - c, rel=1e-9)
        assert row["cuped_difference"] == row["difference"]  # no covariate given: nothing to adjust
        assert row["fixed_p_value"] == pytest.approx(p, rel=1e-6, abs=1e-12)
        assert row["p_value"] >= row["fixed_p_value"] * 0.999  # alpha is spent by the information reached
        assert row["adjusted_p_value"] >= row["p_value"]
        assert row["users_needed_per_arm"] == needed
        assert row["users_still_needed"] == max(0, needed - min(c_n, v_n))
    ab = table.filter((pl.col("experiment") == "ab") & (pl.col("metric") == "ctr")).row(0, named=True)
    # sized for a 5% lift, 190 users per arm are 2% of the planned information: the first looks spend
    # almost none of alpha, so even a lift of 0.1 (z above 4) is not yet significant
    assert ab["fixed_p_value"] < 1e-4 and ab["information"] < 0.05 and not ab["significant"]
    sized = dataclasses.replace(SETTINGS, minimum_effect=0.3)  # a plan these users nearly complete
    ab = pooled(records, interactions, {"ab": "control"}, sized).filter(pl.col("metric") == "ctr").row(0, named=True)
    assert ab["information"] > 0.5 and ab["significant"] and ab["difference"] > 0
    assert ab["difference_low"] > 0 and ab["test"] == "group sequential, 1 looks; Holm over 3 tests"
    assert (ab["control_versions"], ab["variant_versions"]) == ("1", "2")


def test_the_days_of_an_experiment_pool_into_one_test_with_one_look_per_day():
    records, interactions = simulated(6, users=400, lift=0.05)
    answers = scored_answers(frame(records), interactions, SETTINGS)
    morning = answers.filter(pl.col("served_at") < T0 + timedelta(hours=3))
    day_one, day_two = T0.date() - timedelta(days=1), T0.date()
    days = pl.concat(
        [experiment_users(morning, day_one), experiment_users(answers.join(morning, on="answer", how="anti"), day_two)]
    )
    two_looks = by_experiment(days, {"ab": "control"}, SETTINGS).filter(pl.col("metric") == "ctr").row(0, named=True)
    one_look = by_experiment(experiment_users(answers, day_two), {"ab": "control"}, SETTINGS)
    first_day = by_experiment(experiment_users(morning, day_one), {"ab": "control"}, SETTINGS)
    everything, morning_only = (t.filter(pl.col("metric") == "ctr").row(0, named=True) for t in (one_look, first_day))
    assert (two_looks["looks"], two_looks["first_day"]) == (2, str(day_one))
    for column in ("control_users", "variant_users", "difference", "fixed_p_value", "users_needed_per_arm"):
        assert two_looks[column] == pytest.approx(everything[column], rel=1e-9)  # the days pool into one sample
    assert two_looks["control_users"] > morning_only["control_users"]
    assert two_looks["information"] == pytest.approx(everything["information"], rel=1e-9)


def test_cuped_from_the_pre_experiment_outcomes_narrows_the_interval_and_is_reported_beside():
    records, interactions = simulated(7, users=400, lift=0.05)
    answers = scored_answers(frame(records), interactions, SETTINGS)
    users = experiment_users(answers, T0.date())
    per_user = users.filter(pl.col("experiment") == "ab").group_by("user_id").agg(pl.col("hits").sum())
    rng = np.random.default_rng(0)  # a pre-period that predicts each user's hits, as an active user stays active
    covariate = per_user.select(
        "user_id", (pl.col("hits") + pl.Series(rng.normal(0, 0.3, per_user.height))).alias("pre")
    )
    plain = by_experiment(users, {"ab": "control"}, SETTINGS).filter(pl.col("metric") == "hits_per_user")
    cuped = by_experiment(users, {"ab": "control"}, SETTINGS, {"ab": covariate}).filter(
        pl.col("metric") == "hits_per_user"
    )
    before, after = plain.row(0, named=True), cuped.row(0, named=True)
    assert after["difference"] == before["difference"]  # the plain estimate is reported unchanged
    assert after["variance_reduction"] > 0.5 and before["variance_reduction"] == 0
    assert after["cuped_high"] - after["cuped_low"] < 0.7 * (before["cuped_high"] - before["cuped_low"])


def test_a_shadow_publishes_agreement_with_other_live_versions_and_no_p_value():
    records, interactions = simulated(7)
    # every other shadow answer is computed by the version the live answer came from: no comparison
    records = [
        dataclasses.replace(r, model_version="2") if r.role == SHADOW and r.request_id[-1] in "13579" else r
        for r in records
    ]
    answers = scored_answers(frame(records), interactions, SETTINGS)
    table = shadow_against_live(answers, SETTINGS)
    truth = {(t["record"].request_id, t["record"].role): t for t in recompute(records, interactions)}
    found = defaultdict(lambda: {"users": defaultdict(lambda: np.zeros(4)), "overlaps": [], "taus": [], "shifts": []})
    same = 0
    for (request, role), t in truth.items():
        if role != SHADOW or t["record"].variant != "slow":
            continue
        shadow, live = t["record"], truth[(request, LIVE)]
        if shadow.model_version == live["record"].model_version:
            same += 1
            continue
        pair = found[(live["record"].model_version, shadow.model_version)]
        pair["users"][shadow.user_id] += [t["hits"], t["shown"], live["hits"], live["shown"]]
        s, top = shadow.item_ids[:5], live["record"].item_ids[:5]
        shared = [i for i in top if i in s]
        pair["overlaps"].append(len(shared) / max(len(s), len(top)))
        if len(shared) >= 2:
            pairs = [(a, b) for a in range(len(shared)) for b in range(a + 1, len(shared))]
            concordant = sum(1 if s.index(shared[a]) < s.index(shared[b]) else -1 for a, b in pairs)
            pair["taus"].append(concordant / len(pairs))
        pair["shifts"].append(sum(shadow.scores[:5]) / len(s) - sum(live["record"].scores[:5]) / len(top))
    assert set(zip(table["control_versions"], table["variant_versions"])) == {("1", "2"), ("1", "3"), ("2", "3")}
    assert same > 0  # v2 against v2 is left out
    for row in table.iter_rows(named=True):
        pair = found[(row["control_versions"], row["variant_versions"])]
        u = np.array(list(pair["users"].values()))
        assert (row["pairs"], row["same_version_pairs"]) == (len(pair["overlaps"]), same)
        assert row["variant_value"] == pytest.approx(u[:, 0].sum() / u[:, 1].sum(), rel=1e-9)
        assert row["control_value"] == pytest.approx(u[:, 2].sum() / u[:, 3].sum(), rel=1e-9)
        assert row["overlap_at_k"] == pytest.approx(np.mean(pair["overlaps"]), rel=1e-9)
        assert row["rank_correlation"] == pytest.approx(np.mean(pair["taus"]), rel=1e-9)
        assert row["score_shift"] == pytest.approx(np.mean(pair["shifts"]), rel=1e-9)
        assert row["counterfactual"] and not row["significant"] and "p_value" not in row


def test_a_shadow_of_the_live_version_alone_is_no_comparison():
    records, interactions = simulated(8)
    same = [dataclasses.replace(r, model_version="1") for r in records]  # live and shadow all v1
    assert shadow_against_live(scored_answers(frame(same), interactions, SETTINGS), SETTINGS).is_empty()


def test_a_significant_drop_is_found_and_the_verdict_reads_the_comparisons():
    records, interactions = simulated(9, users=400)
    answers = scored_answers(frame(records), interactions, SETTINGS)
    yesterday = by_model(answers, SETTINGS)
    worse = [r for r in records]  # the same traffic, but nobody acts on what is shown
    quiet = interactions.filter(pl.lit(False))
    today = by_model(scored_answers(frame(worse), quiet, SETTINGS), SETTINGS)
    found = drops(today, yesterday, threshold=0.2, alpha=0.01)
    assert {d.served_model for d in found} == {"personalization", "personalization-challenger"}
    assert not drops(yesterday, yesterday, threshold=0.2, alpha=0.01)
    comparisons = by_experiment(experiment_users(answers, T0.date()), {"ab": "control"}, SETTINGS)
    verdict = online_verdict(comparisons, challenger="2", champion="1")
    ab = comparisons.filter((pl.col("experiment") == "ab") & (pl.col("metric") == "ctr"))
    assert verdict.source == "ab" and verdict.p_value == ab["adjusted_p_value"][0]
    assert not online_verdict(comparisons, challenger="7", champion="1").passed


def test_assignments_are_read_per_experiment():
    records, _ = simulated(1, users=20)
    logged = frame(records)
    assert {json.loads(a)["ab"] for a in logged["assignments"].to_list() if a != "{}"} == {"control", "treatment"}


def crowded(seed: int):
    """Live answers (and a shadow beside some) showing few users the same few items within minutes of each
    other, and clicks, plays and impressions at random times, a third echoing one of the user's requests."""
    rng = random.Random(seed)
    records, asked = [], defaultdict(list)
    for n in range(400):
        user, at = rng.randrange(15), T0 + timedelta(seconds=rng.randrange(3 * 3600))
        items = rng.sample(range(12), 5)
        for role, variant in ((LIVE, "control"), (SHADOW, "slow"))[: rng.choice([1, 2])]:
            records.append(
                PredictionRecord(
                    f"r{n}",
                    at,
                    role,
                    "recommend",
                    user,
                    "",
                    variant,
                    {},
                    variant,
                    "m",
                    "1",
                    5,
                    "0" * 64,
                    1.0,
                    items,
                    [0.0] * 5,
                )
            )
        asked[user].append(f"r{n}")
    events = []
    for _ in range(600):
        user = rng.randrange(15)
        echoed = rng.choice([rng.choice(asked[user] or [None]), None, None])
        events.append(
            {
                "user_id": user,
                "item_id": rng.randrange(12),
                "event_type": rng.choice(["click", "play", "impression"]),
                "event_timestamp": T0 + timedelta(seconds=rng.randrange(3 * 3600 + 1800)),
                "session_id": echoed,
            }
        )
    schema = {
        "user_id": pl.Int64,
        "item_id": pl.Int64,
        "event_type": pl.String,
        "event_timestamp": pl.Datetime("us", "UTC"),
        "session_id": pl.String,
    }
    return records, pl.DataFrame(events, schema=schema)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_outcome_is_credited_to_one_answer_as_a_plain_recomputation_credits_it(seed):
    records, interactions = crowded(seed)
    found = credited_outcomes(frame(records), interactions, SETTINGS)
    truth = credit(records, interactions)
    assert (
        dict(zip(found["outcome"].to_list(), zip(found["request_id"].to_list(), found["item_id"].to_list()))) == truth
    )
    # the data exercises the rule: outcomes shown by several answers, echoes that are not the last answer
    last = credit(records, interactions.with_columns(pl.lit(None, pl.String).alias("session_id")))
    assert truth != last and len(truth) == len(last)
    answers = scored_answers(frame(records), interactions, SETTINGS)
    live = answers.filter(pl.col("role") == LIVE)
    assert live["hits"].sum() == len(set(truth.values()))  # an item's click and play are one hit
    by_request = {
        t["record"].request_id: t["hits"] for t in recompute(records, interactions) if t["record"].role == SHADOW
    }
    shadows = answers.filter(pl.col("role") == SHADOW)
    assert dict(zip(shadows["request_id"].to_list(), shadows["hits"].to_list())) == by_request


def test_one_click_shown_by_three_answers_counts_once():
    def answer(request, minutes):
        at = T0 + timedelta(minutes=minutes)
        return PredictionRecord(
            request, at, LIVE, "recommend", 7, "", "control", {}, "m", "m", "1", 5, "0" * 64, 1.0, [42, 1, 2], [0.0] * 3
        )

    records = [answer("a", 0), answer("b", 5), answer("c", 10)]
    click = {"user_id": [7], "item_id": [42], "event_type": ["click"], "event_timestamp": [T0 + timedelta(minutes=12)]}
    answers = scored_answers(
        frame(records), pl.DataFrame(click).with_columns(pl.col("event_timestamp").dt.cast_time_unit("us")), SETTINGS
    )
    assert answers["hits"].to_list() == [0, 0, 1]  # the last answer that showed it
    echoed = pl.DataFrame({**click, "session_id": ["a"]}).with_columns(
        pl.col("event_timestamp").dt.cast_time_unit("us")
    )
    assert scored_answers(frame(records), echoed, SETTINGS)["hits"].to_list() == [1, 0, 0]  # the one it names


# --- sample-ratio mismatch, tiny groups, served-version mix ----------------------------------------------
def assigned_logs(users: np.ndarray, experiments) -> pl.DataFrame:
    """Live recommend requests of `users` (a user may ask several times), each with its assignments."""
    return pl.DataFrame(
        {
            "role": LIVE,
            "endpoint": "recommend",
            "user_id": users,
            "assignments": [json.dumps(assignments(experiments, int(u))) for u in users],
        }
    )


def test_the_srm_check_fires_at_most_at_its_level_on_days_assigned_as_configured():
    rng = np.random.default_rng(38)
    days, fired = 10_000, 0
    for split in ({"control": 0.5, "treatment": 0.5}, {"control": 0.9, "first_version": 0.1}):
        for users in rng.integers(1_000, 100_000, size=days):
            counts = dict(zip(split, rng.multinomial(users, list(split.values()))))
            fired += srm_test("e", counts, split, SETTINGS)["mismatch"]
    # 0.001 of 20,000 days is 20 expected; P(Poisson(20) outside [7, 36]) < 0.001
    assert 7 <= fired <= 36


def test_the_chi_square_is_scipys_on_two_and_three_arms():
    rng = np.random.default_rng(5)
    for shares in ((0.5, 0.5), (0.9, 0.1), (0.2, 0.3, 0.5)):
        for users in (20, 1_000, 100_000):
            observed = rng.multinomial(users, shares).tolist()
            expected = [users * s for s in shares]
            statistic, p = chi_square(observed, expected)
            reference = chisquare(observed, expected)
            assert statistic == pytest.approx(reference.statistic, rel=1e-12)
            assert p == pytest.approx(reference.pvalue, rel=1e-9)


def test_a_one_point_imbalance_at_100000_users_is_caught_every_day():
    rng = np.random.default_rng(1)
    for configured, actual in (((0.5, 0.5), (0.51, 0.49)), ((0.9, 0.1), (0.89, 0.11))):
        split = dict(zip(("control", "treatment"), configured))
        for _ in range(200):
            counts = dict(zip(split, rng.multinomial(100_000, actual)))
            row = srm_test("e", counts, split, SETTINGS)
            assert row["mismatch"] and row["p_value"] < SETTINGS.srm_alpha


def pooled_users(rng, days: int, per_day: int, control_share: float) -> pl.DataFrame:
    """experiment_users rows of an experiment "e" over `days` days of `per_day` new users each, a few
    coming back on later days (counted once by the pooled check)."""
    rows, next_user = [], 0
    for d in range(days):
        arms = np.where(rng.random(per_day) < control_share, "control", "treatment")
        users = np.arange(next_user, next_user + per_day)
        next_user += per_day
        back = rows[-1].sample(n=min(200, rows[-1].height), seed=d) if rows else None
        day = pl.DataFrame({"experiment": "e", "arm": arms, "user_id": users, "day": T0.date() + timedelta(days=d)})
        rows.append(day if back is None else pl.concat([day, back.with_columns(pl.lit(day["day"][0]).alias("day"))]))
    return pl.concat(rows)


def test_a_one_point_imbalance_each_day_misses_is_caught_on_the_pooled_days():
    rng = np.random.default_rng(7)
    split = {"e": {"control": 0.5, "treatment": 0.5}}
    caught_pooled, caught_daily = 0, 0
    for _ in range(20):  # 14 days of about 7,000 new users: 100,000 users, 51/49
        users = pooled_users(rng, 14, 7_143, 0.51)
        (row,) = pooled_sample_ratio(users, split, SETTINGS).to_dicts()
        unique = users.unique(["arm", "user_id"])
        assert row["users"] == unique.height == 14 * 7_143  # a user who came back counts once
        assert row["scope"] == f"pooled {T0.date()}..{T0.date() + timedelta(days=13)}"
        control = unique.filter(pl.col("arm") == "control").height
        assert row["p_value"] == pytest.approx(chisquare([control, row["users"] - control]).pvalue, rel=1e-9)
        caught_pooled += row["mismatch"]
        days = users.partition_by("day")
        caught_daily += sum(pooled_sample_ratio(d, split, SETTINGS)["mismatch"][0] for d in days)
    assert caught_pooled == 20  # z about 6.3: missed with probability about 1e-5 per run
    assert caught_daily <= 0.15 * 20 * 14  # each day alone: z about 1.7, flagged about 6% of days


def test_a_mismatched_experiment_is_no_promotion_evidence():
    records, interactions = simulated(5, users=400, lift=0.5)
    sized = dataclasses.replace(SETTINGS, minimum_effect=0.5)  # the plan's users reached: a full test
    comparisons = pooled(records, interactions, {"ab": "control"}, sized)
    assert online_verdict(comparisons, challenger="2", champion="1").passed  # a real lift, well sampled
    ratios = pl.DataFrame({"experiment": ["ab", "other"], "mismatch": [True, False]})
    marked = with_sample_ratio(comparisons, ratios)
    assert marked.filter(pl.col("experiment") == "ab")["sample_ratio_mismatch"].all()
    assert not marked.filter(pl.col("experiment") == "other")["sample_ratio_mismatch"].any()
    verdict = online_verdict(marked, challenger="2", champion="1")
    assert not verdict.passed and "sample-ratio mismatch" in verdict.reason


def test_answers_whose_horizon_runs_past_the_interactions_taken_in_wait_for_them():
    records, interactions = simulated(4, users=200)
    logs = frame(records)
    until = T0 + timedelta(hours=3)
    kept, waiting = with_complete_horizon(logs, until, SETTINGS.horizon)
    cut = until - SETTINGS.horizon
    assert kept.height == sum(r.served_at <= cut for r in records)
    assert waiting == sum(r.served_at > cut and r.role == LIVE and r.endpoint == "recommend" for r in records)
    assert waiting > 0 and kept["served_at"].max() <= cut
    everything, none = with_complete_horizon(logs, T0 + timedelta(days=1), SETTINGS.horizon)
    assert none == 0 and everything.height == logs.height


def test_a_group_of_one_user_raises_no_drop():
    records, interactions = simulated(9, users=400)
    answers = scored_answers(frame(records), interactions, SETTINGS)
    yesterday = by_model(answers, SETTINGS)
    one = next(r for r in records if r.role == LIVE and r.model_version == "1")
    alone = [r for r in records if r.user_id == one.user_id and r.role == LIVE and r.model_version == "1"]
    today = by_model(scored_answers(frame(alone), interactions.filter(pl.lit(False)), SETTINGS), SETTINGS)
    assert today["users"].to_list() == [1] and math.isnan(today["ctr_se"][0])
    assert not drops(today, yesterday, threshold=0.2, alpha=0.01, minimum_users=1)  # no error, no test
    assert not drops(today, yesterday, threshold=0.2, alpha=0.01)


def test_the_servers_own_assignment_of_the_deployed_experiments_shows_no_mismatch_and_a_lost_arm_does():
    experiments = load(Path(__file__).parents[2] / "deploy" / "experiments.yaml")
    split = {e.name: {v.name: v.traffic for v in e.variants} for e in experiments}
    users = np.random.default_rng(3).integers(0, 10**9, size=20_000)
    logged = assigned_logs(np.concatenate([users, users[:5_000]]), experiments)  # some users ask twice
    table = sample_ratio(logged, split, SETTINGS)
    included = [len({u for u in set(users.tolist()) if e.includes(u)}) for e in experiments]
    assert table["users"].to_list() == included  # a user counts once
    assert not any(table["mismatch"]) and all(p > SETTINGS.srm_alpha for p in table["p_value"])
    first = experiments[0]
    lost = logged.filter(  # the treatment's failed answers were never logged for a tenth of its users
        ~(pl.col("assignments").str.contains(f'"{first.name}": "treatment"') & (pl.col("user_id") % 10 == 0))
    )
    row = sample_ratio(lost, split, SETTINGS).filter(pl.col("experiment") == first.name).row(0, named=True)
    assert row["mismatch"] and "treatment" in row["arms"]


def test_an_experiment_or_arm_missing_from_the_file_is_not_tested_and_says_why():
    row = srm_test("gone", {"control": 500, "treatment": 520}, None, SETTINGS)
    assert row["p_value"] is None and not row["mismatch"] and "not in the experiments file" in row["test"]
    row = srm_test("e", {"control": 500, "new": 20}, {"control": 0.5, "treatment": 0.5}, SETTINGS)
    assert row["p_value"] is None and "new" in row["test"]


def test_an_arm_under_the_minimum_users_gets_no_p_value_and_the_row_says_why():
    records, interactions = simulated(2, users=60, lift=0.5)
    table = pooled(records, interactions, {"ab": "control"})
    row = table.filter((pl.col("experiment") == "ab") & (pl.col("metric") == "ctr")).row(0, named=True)
    assert row["control_users"] < SETTINGS.minimum_users and row["variant_users"] < SETTINGS.minimum_users
    assert row["p_value"] is None and row["difference_low"] is None and not row["significant"]
    assert row["test"] == (
        f"not tested: control has {row['control_users']} users and treatment has {row['variant_users']} users, "
        f"fewer than {SETTINGS.minimum_users}"
    )
    verdict = online_verdict(table, challenger="2", champion="1")
    assert not verdict.passed and "not tested" in verdict.reason
    enough = dataclasses.replace(SETTINGS, minimum_users=2)
    tested = pooled(records, interactions, {"ab": "control"}, enough)
    assert tested.filter(pl.col("experiment") == "ab")["p_value"][0] is not None


def test_each_arms_served_version_mix_shows_another_experiments_variant():
    records, interactions = simulated(4, users=300)
    # another experiment's challenger (v3) answered every fifth request of the treatment arm
    mixed = [
        dataclasses.replace(r, model_version="3") if r.role == LIVE and r.variant == "treatment" and n % 5 == 0 else r
        for n, r in enumerate(records)
    ]
    table = pooled(mixed, interactions, {"ab": "control"})
    row = table.filter((pl.col("experiment") == "ab") & (pl.col("metric") == "ctr")).row(0, named=True)
    live = [r for r in mixed if r.role == LIVE]
    served = defaultdict(lambda: defaultdict(int))
    for r in live:
        served[r.assignments["ab"]][r.model_version] += 1
    for arm, column in (("control", "control_version_mix"), ("treatment", "variant_version_mix")):
        total = sum(served[arm].values())
        ordered = sorted(served[arm].items(), key=lambda kv: (-kv[1], kv[0]))
        assert row[column] == ", ".join(f"v{v} {n} ({n / total:.1%})" for v, n in ordered)
    assert "v3" in row["variant_version_mix"] and "v3" not in row["control_version_mix"]


def test_each_experiment_reads_the_design_of_the_files_that_served_it_and_a_changed_split_blocks():
    from engines.experimentation.experiments import Design, parse_file, served_designs
    from engines.experimentation.online_accuracy import config_uses, design_conflicts

    def served(other_split: float) -> tuple:
        arms = [{"name": "control", "model_version": "1", "traffic": 0.5}]
        arms.append({"name": "treatment", "model_version": "2", "traffic": 0.5})
        other = [{"name": "a", "model_version": "1", "traffic": other_split}]
        other.append({"name": "b", "model_version": "2", "traffic": 1 - other_split})
        raw = {
            "experiments": [
                {"name": "ab", "model": "personalization", "salt": "s1", "variants": arms},
                {"name": "other", "model": "search", "salt": "s2", "variants": other},
            ]
        }
        return parse_file(json.dumps(raw).encode(), "served").experiments

    records, _ = simulated(3, users=50)
    logs = frame(
        [dataclasses.replace(r, experiments_config="d1" if i // 2 % 2 else "d2") for i, r in enumerate(records)]
    )
    users = pl.DataFrame(
        {"experiment": ["ab"], "experiments_config": [None]}, schema_overrides={"experiments_config": pl.String}
    )
    uses = config_uses(logs, users)
    assert set(uses) == {("ab", "d1"), ("ab", "d2"), ("other", "d1"), ("other", "d2"), ("ab", None)}
    designs = served_designs(uses, {"d1": served(1 / 3), "d2": served(0.5), None: served(0.5)})
    assert designs["ab"] == Design("control", {"control": 0.5, "treatment": 0.5}, ("repository file", "d1", "d2"))
    assert (
        "changed while it ran" in designs["other"].conflict
        and "a 0.333333, b 0.666667 in d1" in designs["other"].conflict
    )
    rows = design_conflicts({n: d.conflict for n, d in designs.items() if d.conflict})
    assert rows["experiment"].to_list() == ["other"] and rows["mismatch"].to_list() == [True]
    assert with_sample_ratio(pl.DataFrame({"experiment": ["ab", "other"]}), rows)[
        "sample_ratio_mismatch"
    ].to_list() == [
        False,
        True,
    ]
