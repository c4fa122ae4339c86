"""Notebook to pipeline: one decorator turns a plain Python training function into a daily,
scheduled Dagster asset that asks for its compute (CPU or GPU pool, Ray workers), registers every
model it trains in the registry (alias `challenger`) with its lineage, gates promotion to `champion`
with a blocking asset check, and is covered by the run-failure notifications (`notify_run_failure`
watches every job).

    @training_pipeline("personalization", deps=[...], description="...")
    def train_personalization(run: TrainingRun) -> TrainedModel:
        ...  # read run.lake, train on Ray with run.num_workers / run.use_gpu, save to a folder
"""

import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetSelection,
    BackfillPolicy,
    Config,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    asset,
    build_schedule_from_partitioned_job,
    define_asset_job,
)
from pydantic import Field

from engines.data.lake import Lake
from engines.models.registry import ModelRegistry, RegisteredVersion
from ml.comparison import Comparison, Judgement, judge

GATE_CHECK = "beats_champion"
APPROVED_ALIAS = "approved"  # the version the gate passed: the promotion step moves `champion` to it
EVIDENCE = ("offline", "online")  # what beats_champion judges: held-out data, or the online A/B or shadow result
ONLINE_EVIDENCE_DAYS = 7  # the newest days of online comparisons the online gate reads
BASELINE_CHECK = "beats_baseline"
# Named priority classes -> `dagster/priority` (the queued run coordinator starts higher values first).
PRIORITY_CLASSES = {"critical": 100, "high": 50, "normal": 0, "low": -50, "backfill": -100}
NOTIFY_TAG = "mlplane/notify"  # comma-separated notifier targets that notify_run_failure also posts to
PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout whose commit a model records


@dataclass
class TrainingRun:
    """What a training function gets: the day to train for, the lake, a scratch folder and its compute."""

    day: date
    lake: Lake
    workdir: Path
    num_workers: int
    use_gpu: bool
    training_days: int
    log: Callable[[str], None] = print
    cpus_per_worker: int = 1  # each worker reserves them and runs as many torch threads


@dataclass
class TrainedModel:
    """What a training function returns. `compare` scores a saved model folder (the champion's) and this
    model on this run's held-out rows and returns, per gated metric, the paired comparison of the two
    (ml.comparison: `a` the champion, `b` this model); `gate_metric` names the primary one, or the primary
    ones, on each of which the model must be shown better."""

    model_dir: Path
    metrics: dict[str, float]
    gate_metric: str | tuple[str, ...]
    compare: Callable[[Path], dict[str, Comparison]]
    data_partitions: list[str]
    feature_service: str
    params: dict[str, str] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    # metric -> the baseline's value on the same held-out data; every version, the first included,
    # must beat each one to be promoted (a first version has no champion but always has a baseline)
    baseline: dict[str, float] = field(default_factory=dict)
    # metric -> the paired comparison (ml.comparison: `a` a strong baseline, `b` this model) on the same
    # held-out rows, shown in the baseline check; with `gate_on_comparisons` the model must be shown better
    # on each one (a tie is not better)
    baseline_comparisons: dict[str, Comparison] = field(default_factory=dict)
    gate_on_comparisons: bool = True
    # the model card's consent to log this model's served inputs and features (registry tag mlplane.log_inputs)
    log_inputs: bool = False
    # lineage tags of the training function's own (e.g. the ground-truth releases that fed the model), beside
    # the code version, data partitions and run every version carries
    lineage: dict[str, str] = field(default_factory=dict)

    def short_of_baseline(self) -> dict[str, tuple[float, float]]:
        """The metrics where the model does not beat the baseline: metric -> (model, baseline); for a paired
        comparison, where it is not shown better (the estimates compared)."""
        short = {m: (self.metrics[m], b) for m, b in self.baseline.items() if not self.metrics[m] > b}
        for metric, comparison in self.baseline_comparisons.items():
            if self.gate_on_comparisons and not judge(comparison, margin=0.0).superior:
                short[f"{metric} (paired)"] = (comparison.estimate_b, comparison.estimate_a)
        return short


class TrainingConfig(Config):
    num_workers: int = Field(
        default=1, ge=0, description="Ray Train workers; 0: in the run's own process (Ray Train's local mode)"
    )
    use_gpu: bool = Field(default=False, description="One GPU per worker")
    training_days: int = Field(default=7, description="Newest partitions of training data to use")
    cpus_per_worker: int | None = Field(
        default=None,
        description="CPUs each worker reserves and runs torch threads on; None: its even share of the in-process "
        "Ray (RayResource.cpus_per_worker). Fewer leave room for runs alongside",
    )


@dataclass
class TrainingPipeline:
    model_name: str
    assets: list
    job: object
    schedule: object


def code_version() -> str:
    """The git commit the code runs from (with `-dirty` for uncommitted changes); `unknown` outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return f"{sha}-dirty" if dirty else sha
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pipeline_tags(pool: str, gpus: int, priority: str, notify: tuple[str, ...]) -> dict[str, str]:
    """Run tags: the pool and GPU count the run queue limits (deploy/prod/dagster.yaml), its priority,
    and where failures are posted."""
    if priority not in PRIORITY_CLASSES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITY_CLASSES)}, not {priority!r}")
    if gpus < 0 or (gpus and pool != "gpu"):
        raise ValueError(f"gpus={gpus} needs pool='gpu' (and is never negative), pool is {pool!r}")
    tags = {
        "mlplane/pool": pool,
        "mlplane/gpus": str(gpus),
        "dagster/priority": str(PRIORITY_CLASSES[priority]),
        "mlplane/priority_class": priority,
    }
    if notify:
        tags[NOTIFY_TAG] = ",".join(notify)
    return tags


def training_pipeline(
    model_name: str,
    *,
    description: str,
    deps: list,
    partitions_def: PartitionsDefinition,
    group: str = "models",
    pool: str = "cpu",
    gpus: int = 0,
    hour_of_day: int = 4,
    owners: tuple[str, ...] = ("team:ml-platform",),
    priority: str = "normal",
    notify: tuple[str, ...] = (),
    promotion_evidence: str = "offline",
    online_margin: float = 0.0,
) -> Callable[[Callable], TrainingPipeline]:
    """Turn `fn(TrainingRun) -> TrainedModel` into `models/<name>` (train + register as challenger,
    with the blocking `beats_champion` check), `models/<name>_champion` (promotion, runs only when the
    check passed), a partitioned job on `pool` and a daily schedule. `priority` names a class of
    PRIORITY_CLASSES; `notify` names notifier targets that hear of this pipeline's failed runs.

    `promotion_evidence="online"` gates on how the challenger did with users instead of held-out data:
    the version that was `challenger` before this run (served meanwhile as an A/B variant)
    is promoted when the newest online comparison of it with the champion (monitoring/online_accuracy)
    shows a significant CTR@k lift above `online_margin`; the version this run trains becomes the next
    challenger either way."""
    if promotion_evidence not in EVIDENCE:
        raise ValueError(f"promotion_evidence must be one of {', '.join(EVIDENCE)}, not {promotion_evidence!r}")
    model_key, champion_key = AssetKey(["models", model_name]), champion_asset_key(model_name)
    tags = pipeline_tags(pool, gpus, priority, notify)

    def decorate(fn: Callable[[TrainingRun], TrainedModel]) -> TrainingPipeline:
        train = train_asset(
            fn,
            model_name,
            description=description,
            deps=deps,
            partitions_def=partitions_def,
            group=group,
            owners=owners,
            tags=tags,
            gpus=gpus,
            promotion_evidence=promotion_evidence,
            online_margin=online_margin,
        )
        promote = champion_asset(model_name, partitions_def=partitions_def, group=group, owners=owners)
        job = define_asset_job(
            f"train_{model_name}",
            selection=AssetSelection.assets(model_key, champion_key),
            tags=tags,
            description=f"Train {model_name}, register it and promote it if it beats the champion.",
        )
        schedule = build_schedule_from_partitioned_job(job, hour_of_day=hour_of_day)
        return TrainingPipeline(model_name, [train, promote], job, schedule)

    return decorate


def champion_asset_key(model_name: str) -> AssetKey:
    return AssetKey(["models", f"{model_name}_champion"])


def train_asset(
    fn: Callable[[TrainingRun], TrainedModel],
    model_name: str,
    *,
    description: str,
    deps: list,
    partitions_def: PartitionsDefinition,
    group: str,
    owners: tuple[str, ...],
    tags: dict[str, str],
    gpus: int,
    promotion_evidence: str,
    online_margin: float,
):
    """`models/<name>`: run `fn`, register what it trained as the challenger, and the blocking gate checks."""
    model_key = AssetKey(["models", model_name])

    @asset(
        key=model_key,
        group_name=group,
        description=description,
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
        deps=deps,
        kinds={"pytorch", "ray", "mlflow"},
        owners=list(owners),
        op_tags=tags,
        required_resource_keys={"lake", "ray", "model_registry"},
        check_specs=gate_check_specs(model_key),
    )
    def train_and_register(context, config: TrainingConfig):
        registered = register_trained(context, config, fn, model_name, gpus)
        verdict = promotion_verdict(context, registered, model_name, promotion_evidence, online_margin)
        yield MaterializeResult(metadata=registered.metadata(model_name))
        yield verdict.check_result(registered, promotion_evidence)
        yield baseline_check(registered.trained)

    return train_and_register


def champion_asset(model_name: str, *, partitions_def: PartitionsDefinition, group: str, owners: tuple[str, ...]):
    """`models/<name>_champion`: promote the challenger that passed the gate checks."""

    @asset(
        key=champion_asset_key(model_name),
        group_name=group,
        description=f"Moves the `champion` alias of {model_name!r} to the challenger that passed "
        f"`{GATE_CHECK}` and `{BASELINE_CHECK}`; `mlplane models rollback` moves it back.",
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
        deps=[AssetKey(["models", model_name])],
        kinds={"mlflow"},
        owners=list(owners),
        required_resource_keys={"model_registry"},
    )
    def promote(context):
        return promote_approved(context.resources.model_registry.get_client(), model_name, context.run.run_id)

    return promote


@dataclass
class TrainingOutcome:
    """A training run's outcome: the trained model, its registered version (now `challenger`) with its
    lineage, and what the gate compares it with (the champion, and the challenger before this run)."""

    day: date
    lake: Lake
    trained: TrainedModel
    version: RegisteredVersion
    lineage: dict[str, str]
    champion: RegisteredVersion | None
    comparisons: dict[str, Comparison]
    under_test: RegisteredVersion | None
    registry: ModelRegistry

    def metadata(self, model_name: str) -> dict:
        lineage = {k: v for k, v in self.lineage.items() if k != "mlplane.dagster_run_id"}
        return {
            "model": model_name,
            "version": MetadataValue.int(int(self.version.version)),
            "registry": self.registry.tracking_uri,
            **lineage,
            **self.trained.metadata,
        }


def register_trained(context, config: TrainingConfig, fn, model_name: str, gpus: int) -> TrainingOutcome:
    """Train with `fn` for the run's newest partition, register the model with its lineage as `challenger`,
    and compare it with the champion on this run's held-out rows."""
    resources = context.resources
    day = date.fromisoformat(context.partition_keys[-1])
    registry = resources.model_registry.get_client()
    resources.ray.ensure_started()
    under_test = registry.by_alias(model_name, "challenger")  # the online gate judges this one
    lake = resources.lake.get_client()
    with tempfile.TemporaryDirectory(prefix=f"train-{model_name}-") as work:
        run = TrainingRun(
            day,
            lake,
            Path(work),
            config.num_workers,
            config.use_gpu or gpus > 0,
            config.training_days,
            context.log.info,
            config.cpus_per_worker or resources.ray.cpus_per_worker(config.num_workers),
        )
        trained = fn(run)
        lineage = {
            "mlplane.code_version": code_version(),
            "mlplane.data_partitions": ",".join(trained.data_partitions),
            "mlplane.feature_service": trained.feature_service,
            "mlplane.dagster_run_id": context.run.run_id,
            "mlplane.dagster_asset": f"models/{model_name}",
            "mlplane.partition": day.isoformat(),
            **trained.lineage,
        }
        version = registry.register(
            model_name, trained.model_dir, lineage, trained.metrics, trained.params, log_inputs=trained.log_inputs
        )
        who = f"dagster run {context.run.run_id}"
        registry.set_alias(model_name, "challenger", version.version, who=who, reason=f"trained for {day}")
        champion = registry.by_alias(model_name, "champion")
        comparisons = {}
        if champion is not None:
            comparisons = trained.compare(registry.load(model_name, champion.version, Path(work) / "champion"))
    return TrainingOutcome(day, lake, trained, version, lineage, champion, comparisons, under_test, registry)


@dataclass
class PromotionVerdict:
    """What `beats_champion` decided: whether a version is approved for promotion, which, and why."""

    passed: bool
    approved: str
    reason: str
    margin: float
    offline: "OfflineVerdict | None"
    online: dict

    def check_result(self, registered: TrainingOutcome, evidence: str) -> AssetCheckResult:
        return AssetCheckResult(
            check_name=GATE_CHECK,
            passed=self.passed,
            severity=AssetCheckSeverity.ERROR,
            description=self.reason,
            metadata={
                "evidence": evidence,
                "approved_version": self.approved if self.passed else "(none)",
                **{f"online_{k}": v for k, v in self.online.items() if k != "reason"},
                "metric": ", ".join(_as_tuple(registered.trained.gate_metric)),
                "challenger_version": registered.version.version,
                "champion_version": registered.champion.version if registered.champion else "(none yet)",
                "margin": self.margin,
                **({"offline_comparisons": self.offline.table()} if self.offline else {}),
            },
        )


def promotion_verdict(
    context, registered: TrainingOutcome, model_name: str, evidence: str, online_margin: float
) -> PromotionVerdict:
    """Judge the registered version on held-out data (or, with online evidence, the previous challenger on
    its A/B result) and point `approved` at the version that passed, or clear it."""
    registry = registered.registry
    margin = context.resources.model_registry.promotion_margin
    trained, champion = registered.trained, registered.champion
    offline = offline_verdict(registered.comparisons, trained.gate_metric, margin) if champion else None
    passed, approved = offline is None or offline.passed, registered.version.version
    reason = offline.reason if offline else "no champion yet: nothing to beat"
    online: dict = {}
    if evidence == "online":
        passed, approved, online = online_gate(
            registered.lake, registered.day, model_name, registered.under_test, champion, online_margin
        )
        reason = online["reason"]
    record_approval(registry, model_name, approved if passed else None, context.run.run_id, reason)
    return PromotionVerdict(passed, approved, reason, margin, offline, online)


def gate_check_specs(model_key: AssetKey) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(
            GATE_CHECK,
            asset=model_key,
            blocking=True,
            description="On the same held-out rows (paired tests, ml.comparison) the challenger is better "
            "than the champion on the gate metric and not worse by more than the registry's promotion margin on "
            "any gated metric; blocks promotion and clears `approved` otherwise",
        ),
        AssetCheckSpec(
            BASELINE_CHECK,
            asset=model_key,
            blocking=True,
            description="The challenger beats the training function's baseline (e.g. "
            "popularity) on every gated held-out metric; blocks promotion "
            "of any version otherwise, the first included",
        ),
    ]


def baseline_check(trained: TrainedModel) -> AssetCheckResult:
    short = trained.short_of_baseline()
    rows = [f"| {m} | {trained.metrics[m]:.4f} | {b:.4f} | point estimate |" for m, b in trained.baseline.items()]
    rows += [
        f"| {m} | {c.estimate_b:.4f} | {c.estimate_a:.4f} | {c.method}: {c.difference:+.4f} "
        f"[{c.low:+.4f}, {c.high:+.4f}], p {c.p_value:.3g} |"
        for m, c in trained.baseline_comparisons.items()
    ]
    gated = [*trained.baseline, *(trained.baseline_comparisons if trained.gate_on_comparisons else [])]
    return AssetCheckResult(
        check_name=BASELINE_CHECK,
        passed=not short,
        severity=AssetCheckSeverity.ERROR,
        description=("beats the baselines on " + ", ".join(gated))
        if not short
        else "does not beat the baselines on " + ", ".join(short),
        metadata={
            "comparison": MetadataValue.md(
                "| metric | challenger | baseline | test |\n|---|---|---|---|\n" + "\n".join(rows)
            )
        },
    )


@dataclass(frozen=True)
class OfflineVerdict:
    """The held-out gate: better than the champion on the primary metric, not worse by more than the
    margin on any gated metric, each a one-sided test at the comparisons' level."""

    passed: bool
    reason: str
    comparisons: dict[str, Comparison]
    judgements: dict[str, Judgement]

    def table(self) -> MetadataValue:
        head = "| metric | champion | challenger | difference [interval] | p | not worse | better | test |\n"
        rows = [
            f"| {m} | {c.estimate_a:.4f} | {c.estimate_b:.4f} | {c.difference:+.4f} [{c.low:+.4f}, {c.high:+.4f}] "
            f"| {c.p_value:.3g} | {self.judgements[m].non_inferior} | {self.judgements[m].superior} | {c.method} |"
            for m, c in self.comparisons.items()
        ]
        return MetadataValue.md(head + "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))


def offline_verdict(
    comparisons: dict[str, Comparison], primary: str | tuple[str, ...], margin: float
) -> OfflineVerdict:
    """Whether the challenger passes the held-out gate (ml.comparison.judge on each paired comparison): shown
    better on the primary metric (every one, when several), not worse by more than the margin on any. A tie
    is not better: it stays a challenger."""
    primaries = _as_tuple(primary)
    unknown = [p for p in primaries if p not in comparisons]
    if unknown:
        raise ValueError(f"the gate metric {unknown[0]!r} is not among the compared metrics {sorted(comparisons)}")
    judgements = {metric: judge(c, margin=margin) for metric, c in comparisons.items()}
    worse = [metric for metric, j in judgements.items() if not j.non_inferior]
    not_better = [p for p in primaries if not judgements[p].superior]
    if worse:
        reason = "; ".join(f"{m}: {judgements[m].reason}" for m in worse)
    elif not_better:
        reason = "; ".join(
            f"{p} not shown better than the champion, so it stays a challenger: {judgements[p].reason}"
            for p in not_better
        )
    else:
        reason = "; ".join(f"{p} {judgements[p].reason}" for p in primaries)
        reason += f"; no gated metric worse by more than {margin:g}"
    return OfflineVerdict(not worse and not not_better, reason, comparisons, judgements)


def _as_tuple(metric: str | tuple[str, ...]) -> tuple[str, ...]:
    return (metric,) if isinstance(metric, str) else tuple(metric)


def record_approval(registry, model_name: str, version: str | None, run_id: str, reason: str) -> None:
    """Point `approved` at the version the gate passed, or clear it when the gate failed: the promotion
    step never finds an approval older than the newest verdict."""
    who = f"dagster run {run_id}"
    if version is not None:
        registry.set_alias(model_name, APPROVED_ALIAS, version, who=who, reason=f"passed {GATE_CHECK}: {reason}")
    elif registry.by_alias(model_name, APPROVED_ALIAS) is not None:
        registry.clear_alias(model_name, APPROVED_ALIAS, who=who, reason=f"failed {GATE_CHECK}: {reason}")


def promote_approved(registry, model_name: str, run_id: str) -> MaterializeResult:
    """Moves `champion` to the version the gate approved; nothing is promoted without one."""
    approved = registry.by_alias(model_name, APPROVED_ALIAS)
    if approved is None:
        raise ValueError(f"{model_name!r} has no version approved by {GATE_CHECK}: nothing promotes without it")
    current = registry.by_alias(model_name, "champion")
    if current is None or current.version != approved.version:
        registry.set_alias(
            model_name,
            "champion",
            approved.version,
            who=f"dagster run {run_id}",
            reason=f"passed {GATE_CHECK} and {BASELINE_CHECK}",
        )
    return MaterializeResult(
        metadata={"champion_version": approved.version, "previous_champion": current.version if current else "(none)"}
    )


def online_gate(lake: Lake, day: date, model_name: str, under_test, champion, margin: float) -> tuple[bool, str, dict]:
    """(passed, the version to promote, metadata) from the online comparisons of the days up to `day`."""
    from engines.experimentation.online_accuracy import newest_comparisons, online_verdict

    if under_test is None or champion is None or under_test.version == champion.version:
        return False, "", {"reason": f"no challenger under online test against a champion of {model_name!r}"}
    comparisons = newest_comparisons(lake, day, ONLINE_EVIDENCE_DAYS)
    verdict = online_verdict(comparisons, under_test.version, champion.version, margin)
    return (
        verdict.passed,
        under_test.version,
        {
            "reason": verdict.reason,
            "version": under_test.version,
            "source": verdict.source or "(none)",
            "difference": verdict.difference,
            "p_value": verdict.p_value,
        },
    )
