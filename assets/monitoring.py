"""`monitoring/online_accuracy`: how the served models did on what users did next
(engines.experimentation.online_accuracy), per model version and variant, per experiment and per shadow, with
latency from the prediction logs. Its checks fail when a live model's CTR drops beyond a threshold (the failure
is posted to the webhook, the notifier resource, with the numbers) and when an experiment's users per arm do not
match its configured split (sample-ratio mismatch: its comparisons cannot be trusted). Each experiment's control
and split come from the experiments file the server ran (stored beside the logs, named by each record), not from
the repository's file at analysis time, which is read only for logs that name no file."""

import base64
import math
from datetime import date, datetime, timedelta

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetKey,
    BackfillPolicy,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    TimeWindowPartitionMapping,
    asset,
)
from pydantic import Field

from assets.experiments import EXPERIMENTS_FILE
from assets.ingestion import warehouse_key
from assets.metadata import table
from assets.partitions import partition_days, serving_partitions
from assets.prediction_logs import KEY as PREDICTION_LOGS
from assets.prediction_logs import READS as SERVING_INPUTS
from engines.experimentation import experiments as experiments_engine
from engines.experimentation import online_accuracy as accuracy
from engines.experimentation import prediction_logs as logs
from engines.experimentation.experiments import Design, ExperimentConfigError, load, parse_file
from feature_defs.compile.polars import day_end
from feature_defs.sources import interactions
from ml.plots import lines_png
from resources.lake import LakeResource
from resources.notifications import WebhookNotifier

KEY = AssetKey(["monitoring", "online_accuracy"])
ZONE, MODELS_TABLE, COMPARISONS_TABLE = accuracy.ZONE, accuracy.MODELS_TABLE, accuracy.COMPARISONS_TABLE
EXPERIMENT_USERS_TABLE = accuracy.EXPERIMENT_USERS_TABLE
DROP_CHECK = "no_ctr_drop"
SRM_CHECK = "no_sample_ratio_mismatch"
LATENCY_CHECK = "latency_within_slo"
PNG_URI = "data:image/png;base64,"


class OnlineAccuracyConfig(Config):
    k: int = Field(default=10, ge=1, description="Items of each answer scored (CTR@k, NDCG@k)")
    horizon_minutes: int = Field(
        default=60,
        ge=1,
        le=24 * 60,
        description="A click or play is credited to the answer it echoes, else the last that showed its item "
        "within this long before it (the next day's interactions are read for late answers)",
    )
    drop_threshold: float = Field(
        default=0.2, gt=0, lt=1, description="Relative CTR drop against the earlier days that fails the check"
    )
    drop_alpha: float = Field(default=0.01, gt=0, lt=1, description="...when significant at this level")
    history_days: int = Field(default=7, ge=1, description="Earlier days the drop is measured against")
    minimum_effect: float = Field(
        default=0.05,
        gt=0,
        description="Relative lift experiments are sized for: the sample-size figure and the information "
        "over which the group-sequential test spends alpha",
    )
    minimum_users: int = Field(
        default=100, ge=2, description="Users an arm needs before a p-value or significance is published"
    )
    cuped_days: int = Field(
        default=14, ge=1, description="Days before an experiment's first day whose outcomes are the CUPED covariate"
    )
    latency_slo_p99_ms: float = Field(
        default=500.0, gt=0, description="Latency SLO: a live model whose P99 in the logs is over it fails the check"
    )
    latency_minimum_answers: int = Field(
        default=100, ge=1, description="Answers a model needs in the day before its P99 is judged"
    )


def settings_of(config: OnlineAccuracyConfig) -> accuracy.AccuracySettings:
    return accuracy.AccuracySettings(
        k=config.k,
        horizon=timedelta(minutes=config.horizon_minutes),
        minimum_effect=config.minimum_effect,
        minimum_users=config.minimum_users,
        cuped_days=config.cuped_days,
    )


def repository_experiments() -> tuple:
    """The experiments of the repository's file: read only for logs that predate the recorded config."""
    try:
        return tuple(load(EXPERIMENTS_FILE))
    except ExperimentConfigError:
        return ()


def served_designs(lake_root, logged: pl.DataFrame, pooled: pl.DataFrame) -> dict[str, Design]:
    """Each experiment's control and split from the experiments files the server ran (stored beside the
    logs, by the digest each record names); records that name none (written before the server recorded
    it) are read with the repository's file. A named file missing or unparsable fails the run: guessing
    the split would test the arms against the wrong one."""
    uses = accuracy.config_uses(logged, pooled)
    configs: dict = {}
    for digest in {d for _, d in uses}:
        if digest is None:
            configs[None] = repository_experiments()
            continue
        try:
            data = logs.read_config(lake_root, digest)
            configs[digest] = parse_file(data, f"served experiments config {digest}").experiments
        except (OSError, ValueError) as error:  # ExperimentConfigError is a ValueError
            raise Failure(f"cannot read the experiments config the server ran: {error}") from error
    return experiments_engine.served_designs(uses, configs)


def without_config(logged: pl.DataFrame) -> int:
    """Live recommend records that name no experiments file (an older server, or one run without a file)."""
    live = logged.filter((pl.col("role") == logs.LIVE) & (pl.col("endpoint") == "recommend"))
    return int(live["experiments_config"].is_null().sum())


def designs_table(designs: dict[str, Design]) -> list[dict]:
    return [
        {
            "experiment": name,
            "control": d.control,
            "split": ", ".join(f"{arm} {share:g}" for arm, share in d.split.items()),
            "served_configs": ", ".join(d.configs),
            "conflict": d.conflict or "-",
        }
        for name, d in sorted(designs.items())
    ]


def ctr_picture(lake, day: date, answers: pl.DataFrame, k: int) -> MetadataValue:
    """CTR@k per hour and variant as a PNG beside the day's online_accuracy partition, shown in the UI as a
    Markdown image (the file's bytes inline: the UI cannot reach the lake's files)."""
    series = accuracy.ctr_over_time(answers) if answers.height else pl.DataFrame()
    if not series.height:
        return MetadataValue.md("(no answers)")
    lines = {f"{r} {v}": list(zip(g["served_at"], g["ctr"])) for (r, v), g in series.group_by("role", "variant")}
    path = lake.partition_path(ZONE, MODELS_TABLE, day).with_name("ctr_over_time.png")
    try:
        lines_png(lines, path, f"CTR@{k} per hour, {day} (shadows: counterfactual)")
    except ValueError:  # every hour without an item shown
        return MetadataValue.md("(no items shown)")
    encoded = base64.b64encode(path.read_bytes()).decode()
    return MetadataValue.md(f"![CTR@{k} per hour]({PNG_URI}{encoded})\n\n`{path}`")


def read_interactions(lake, day: date) -> tuple[pl.DataFrame, datetime]:
    """The day's interactions and the next day's (for answers late in the day), and the time they reach:
    the end of the next day when it is taken in, else the end of the day."""
    present = [
        d for d in (day, day + timedelta(days=1)) if lake.partition_path("warehouse", interactions.name, d).exists()
    ]
    if day not in present:
        raise Failure(f"no warehouse interactions for {day}: the outcomes that follow the answers are not ingested")
    scanned = lake.scan_partitions("warehouse", interactions.name, present)
    frame = scanned.select("user_id", "item_id", "event_type", "event_timestamp", accuracy.ECHO).collect()
    return frame, day_end(present[-1])


def history(lake, day: date, days: int) -> pl.DataFrame:
    scanned = lake.scan_partitions(ZONE, MODELS_TABLE, [day - timedelta(days=d) for d in range(1, days + 1)])
    return scanned.collect() if scanned is not None else pl.DataFrame()


def rounded(frame: pl.DataFrame) -> list[dict]:
    """Rows for a metadata table: floats rounded, and a column with a missing value (null or NaN, which the
    Dagster UI cannot parse) written as text, "-" where missing."""
    rows = [{k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()} for row in frame.to_dicts()]
    gappy = {k for row in rows for k, v in row.items() if v is None or (isinstance(v, float) and math.isnan(v))}
    return [{k: (_text(v) if k in gappy else v) for k, v in row.items()} for row in rows]


def _text(value) -> str:
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "-" if missing else f"{value:.5g}" if isinstance(value, float) else str(value)


@asset(
    key=KEY,
    group_name="monitoring",
    description="Online accuracy of the served models: the prediction logs joined with the clicks and plays "
    "that followed within a horizon, each credited to one answer, per model version and variant (CTR@k, "
    "NDCG@k with intervals), per experiment over its pooled days (plain and CUPED differences, "
    "a group-sequential test with Holm's adjustment, the sample-size figure and the users still needed), "
    "shadows against the live answers of the same requests, latency percentiles per model. Also reads its "
    "own earlier experiment_users partitions and the interactions of the days before each experiment.",
    partitions_def=serving_partitions,
    backfill_policy=BackfillPolicy.multi_run(1),  # a day per run: each day is checked against the ones before
    deps=[
        *SERVING_INPUTS,  # the model versions scored; the experiments files served are stored beside the logs
        PREDICTION_LOGS,
        AssetDep(
            warehouse_key(interactions), partition_mapping=TimeWindowPartitionMapping(start_offset=0, end_offset=1)
        ),
    ],
    kinds={"polars", "parquet"},
    owners=["team:ml-platform"],
    tags={"domain": "monitoring"},
    check_specs=[
        AssetCheckSpec(
            DROP_CHECK,
            asset=KEY,
            description="No live model's CTR@k fell beyond the threshold "
            "against its earlier days (posted to the webhook)",
        ),
        AssetCheckSpec(
            LATENCY_CHECK,
            asset=KEY,
            description="Each live model's P99 latency in the day's logs is within the SLO (posted to the webhook)",
        ),
        AssetCheckSpec(
            SRM_CHECK,
            asset=KEY,
            description="Each experiment's users per arm match its configured split, on the day and on the "
            "pooled days of the experiment (chi-square goodness of fit; a mismatch at p < 0.001 blocks)",
        ),
    ],
)
def online_accuracy(context, config: OnlineAccuracyConfig, lake: LakeResource, notifier: WebhookNotifier):
    (day,) = partition_days(context)
    the_lake, settings = lake.get_client(), settings_of(config)
    logged = logs.conform(the_lake.read_partition(logs.ZONE, logs.TABLE, day))
    outcomes, until = read_interactions(the_lake, day)
    scored, waiting = accuracy.with_complete_horizon(logged, until, settings.horizon)
    answers = accuracy.scored_answers(scored, outcomes, settings)
    models = accuracy.by_model(answers, settings)
    designs, ratios, comparisons = analyse_experiments(the_lake, day, logged, answers, settings)
    found = accuracy.drops(
        models,
        history(the_lake, day, config.history_days),
        config.drop_threshold,
        config.drop_alpha,
        config.minimum_users,
    )
    if not models.is_empty():
        the_lake.write_partition(ZONE, MODELS_TABLE, day, models)
    if not comparisons.is_empty():
        the_lake.write_partition(ZONE, COMPARISONS_TABLE, day, comparisons)
    notified = notify(notifier, day, found) if found else False
    yield drop_check(found, notified, config)
    yield sample_ratio_check(ratios, settings)
    latencies = accuracy.latency(logged)
    yield latency_check(notifier, day, latencies, config)
    yield MaterializeResult(
        metadata={
            "answers": int(answers.height),
            "horizon_minutes": config.horizon_minutes,
            "outcomes_until": MetadataValue.timestamp(until),
            "answers_awaiting_outcomes": waiting,  # their horizon runs past the interactions taken in
            "by_model": table(rounded(models)),
            "experiments": table(rounded(comparisons)),
            "experiment_tests": "pooled days of each experiment, one look per day; group-sequential test of the "
            f"CUPED estimate (O'Brien-Fleming-type alpha spending over the users a {config.minimum_effect:.0%} lift "
            f"needs), Holm over each experiment's variants x metrics at alpha {settings.alpha}; "
            f"no test under {config.minimum_users} users per arm",
            "latency_from_logs": table(rounded(latencies)),
            "experiment_designs": table(designs_table(designs)),  # the control and split each analysis used
            "answers_without_experiments_config": without_config(logged),  # read with the repository's file
            "ctr_over_time": ctr_picture(the_lake, day, answers, config.k),
            **ctr_by_variant(models),
        }
    )


def analyse_experiments(lake, day: date, logged: pl.DataFrame, answers: pl.DataFrame, settings):
    """The day's experiment users (written to the lake), pooled over each experiment's days, and from them
    the design each experiment was served with, its sample ratios and its comparisons with the control."""
    experiment_users = accuracy.experiment_users(answers, day)
    if not experiment_users.is_empty():
        lake.write_partition(ZONE, EXPERIMENT_USERS_TABLE, day, experiment_users)
    pooled = accuracy.pooled_days(lake, day, experiment_users) if answers.height else experiment_users
    designs = served_designs(lake.root, logged, pooled)
    ratios = sample_ratios(logged, pooled, designs, settings)
    compared = experiment_comparisons(lake, answers, pooled, designs, settings)
    return designs, ratios, accuracy.with_sample_ratio(compared, ratios)


def drop_check(found: list[accuracy.Drop], notified: bool, config: OnlineAccuracyConfig) -> AssetCheckResult:
    """The check that no live model's CTR@k fell against its earlier days: the drops found, and whether the
    webhook heard of them."""
    return AssetCheckResult(
        check_name=DROP_CHECK,
        passed=not found,
        severity=AssetCheckSeverity.ERROR,
        description="; ".join(
            f"{d.served_model}: CTR@{config.k} {d.ctr:.4f} vs {d.baseline_ctr:.4f} "
            f"(-{d.relative_drop:.0%}, p={d.p_value:.2g})"
            for d in found
        )
        or "no drop",
        metadata={
            "threshold": config.drop_threshold,
            "alpha": config.drop_alpha,
            "notified": notified,
            "drops": table([d.__dict__ for d in found]),
        },
    )


def ctr_by_variant(models: pl.DataFrame) -> dict[str, float]:
    """`ctr/<role>/<variant>` -> CTR@k of each live model that has one, as numeric metadata to plot."""
    return {
        f"ctr/{r['role']}/{r['variant']}": float(r["ctr"])
        for r in models.iter_rows(named=True)
        if r["ctr"] is not None and not math.isnan(r["ctr"])
    }


def experiment_comparisons(lake, answers, users, designs: dict[str, Design], settings) -> pl.DataFrame:
    """The A/B rows over the pooled days of each experiment running today (`users`), each against the
    control of the file that served it (`designs`), and the shadow rows of today."""
    if not answers.height:
        return pl.DataFrame()
    controls = {name: design.control for name, design in designs.items()}
    tables = (
        accuracy.by_experiment(users, controls, settings, accuracy.covariates(lake, users, settings)),
        accuracy.shadow_against_live(answers, settings),
    )
    found = [t for t in tables if not t.is_empty()]
    return pl.concat(found, how="diagonal_relaxed") if found else pl.DataFrame()


def sample_ratios(
    logged: pl.DataFrame, pooled: pl.DataFrame, designs: dict[str, Design], settings: accuracy.AccuracySettings
) -> pl.DataFrame:
    """Each experiment's users per arm against the split of the file that served it, on the day and on its
    pooled days; an experiment whose served files disagree on the split is a mismatch of its own."""
    configured = {name: design.split for name, design in designs.items() if not design.conflict}
    found = [
        accuracy.sample_ratio(logged, configured, settings),
        accuracy.pooled_sample_ratio(pooled, configured, settings),
        accuracy.design_conflicts({name: d.conflict for name, d in designs.items() if d.conflict}),
    ]
    found = [f for f in found if not f.is_empty()]
    return pl.concat(found, how="diagonal_relaxed") if found else pl.DataFrame()


def sample_ratio_check(ratios: pl.DataFrame, settings: accuracy.AccuracySettings) -> AssetCheckResult:
    """Fails on a mismatch; its experiment's comparisons carry `sample_ratio_mismatch`, and the online
    promotion evidence refuses them (`online_verdict`)."""
    mismatched = ratios.filter(pl.col("mismatch")) if ratios.height else ratios
    return AssetCheckResult(
        check_name=SRM_CHECK,
        passed=mismatched.is_empty(),
        severity=AssetCheckSeverity.ERROR,
        description="; ".join(
            f"{r['experiment']} ({r['scope']}): {r['arms']} (p={r['p_value']:.2g})"
            for r in mismatched.iter_rows(named=True)
        )
        or "every experiment's users match its split",
        metadata={"alpha": settings.srm_alpha, "experiments": table(rounded(ratios))},
    )


def latency_check(
    notifier: WebhookNotifier, day: date, latencies: pl.DataFrame, config: OnlineAccuracyConfig
) -> AssetCheckResult:
    slow = accuracy.latency_breaches(latencies, config.latency_slo_p99_ms, config.latency_minimum_answers)
    text = "; ".join(
        f"{r['served_model']} v{r['model_version']} {r['endpoint']}: P99 {r['p99_ms']:.0f} ms"
        for r in slow.iter_rows(named=True)
    )
    notified = bool(text) and notifier.post(
        {
            "text": f"mlplane latency {day}: over the {config.latency_slo_p99_ms:g} ms P99 SLO: {text}",
            "asset": KEY.to_user_string(),
            "check": LATENCY_CHECK,
            "partition": day.isoformat(),
            "breaches": slow.to_dicts(),
        }
    )
    return AssetCheckResult(
        check_name=LATENCY_CHECK,
        passed=slow.is_empty(),
        severity=AssetCheckSeverity.ERROR,
        description=text or f"every live model's P99 is within {config.latency_slo_p99_ms:g} ms",
        metadata={
            "slo_p99_ms": config.latency_slo_p99_ms,
            "minimum_answers": config.latency_minimum_answers,
            "notified": notified,
            "breaches": table(rounded(slow)),
        },
    )


def notify(notifier: WebhookNotifier, day: date, found: list[accuracy.Drop]) -> bool:
    text = "; ".join(
        f"{d.served_model} CTR {d.ctr:.4f} vs {d.baseline_ctr:.4f} (-{d.relative_drop:.0%})" for d in found
    )
    return notifier.post(
        {
            "text": f"mlplane online accuracy {day}: CTR drop: {text}",
            "asset": KEY.to_user_string(),
            "check": DROP_CHECK,
            "partition": day.isoformat(),
            "drops": [d.__dict__ for d in found],
        }
    )
