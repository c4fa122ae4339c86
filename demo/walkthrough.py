"""`mlplane demo`: the platform over a simulated marketplace. Each part is a Dagster run in the local
instance (the UI shows them afterwards) or a call to a service started for a moment; the end says what
came out and where to look."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import click

from orchestration.lanes import Background, allow_runs_on_threads

# Days whose training sets exist before the held-out one: the demo's last day waits for the next day's
# interactions, so four days give two training days and a held-out one; the personalization gate needs
# that much history for the model to beat popularity (benchmarks/model_quality.py shows the margin).
DEMO_DAYS = 4
MODEL = "personalization"
RECOMMENDATIONS = "inference/personalization_recommendations"
EMBEDDINGS, VIOLATION_FLAGS = "embeddings/items", "content_violations/flags"
VIOLATION_ACCURACY = "monitoring/violation_accuracy"
SUMMARY_ZONES = ["warehouse", "offline", "datasets", "streaming_history", "embeddings", "content_violations"]
SUMMARY_ZONES += ["inference", "serving", "monitoring"]
# the asset's default is 30; each epoch of the compact model takes ~7 s on one core at scale 1, and its
# held-out recall@10 was 0.46 after 2 epochs, 0.52 after 3 and 0.61 after 5 (random: 0.03)
CLIP_EPOCHS = 3
# the queues hold few violations, and agreement falls fast with errors at low prevalence: with an error rate e
# and a share p of violations, Krippendorff's alpha is about 1 - e / (p (1 - p)), so at the few percent of
# violations a later day's queue holds, 1% errors put it at the release's floor of 0.667 and 0.1% well above
ANNOTATOR_ACCURACY = 0.999
# the trainings run in the demo's process (Ray Train's local mode, ml/ray_train.py): a Ray Train worker and
# its helper actors cost each training about 9 s and 13 CPU-seconds of two cores before it trained
TRAIN_WORKERS = 0


def run_demo(data_dir: Path, first: date, days: int, simulate: Callable[[], object]) -> None:
    last = first + timedelta(days=days - 1)
    started = time.monotonic()

    def step(text: str) -> None:
        click.echo(f"{text}  (at {time.monotonic() - started:.0f} s)")

    step(f"1/8 simulating {days} days ({first} .. {last}) into {data_dir}/landing")
    simulate()
    start_ray_quietly(data_dir)
    hide_library_deprecations()
    allow_runs_on_threads()
    step("2/8 the daily pipeline, the streaming backfill and the training sets (Dagster runs, in the UI)")
    materialize_catalogue(first, last)
    # the CLIP lane needs only the catalogue: it runs beside the rest of step 2, whose runs are mostly
    # single-threaded (one core of two idle)
    step("3/8 alongside: the CLIP model (Ray Train, in this process), item embeddings (Ray Data) into Qdrant, a search")
    clip_lane = Background(embeddings_and_search, data_dir, first, last)
    materialize_data(first, last)
    remember_landed_days(data_dir, first, last)
    clip_lane.wait()
    create_registry_store(data_dir)
    # the tail's parts that share no data run in pairs: each of them alone leaves a core mostly idle
    step("4/8 beside step 5, a labeling round: queues, simulated annotators in the labeling app, a release, flags")
    labeling = Background(labeling_round, data_dir, first, last)
    step(f"5/8 training {MODEL} (Ray Train, in this process), gating it against popularity, promoting it")
    champion = train_and_gate(data_dir, last)
    labeling.wait()
    if champion:
        step(
            f"6/8 batch inference: v{champion}'s lists for every active user, into the online store; beside it and "
            "step 7, a second version trained on one day (on one CPU) for step 8's A/B test"
        )
        # the newest three days: one training day, the held-out one and the last (no labels yet); one of
        # Ray's two CPUs, the other is batch inference's
        second = Background(train_and_gate, data_dir, last, 3, 1)
        if not run_job("batch_inference", [RECOMMENDATIONS], partition=last).success:
            raise click.ClickException("the batch inference run failed; see `mlplane ui`")
        step("7/8 a live recommendation from the model server (`mlplane serve models`, for a moment)")
        live_recommendation(data_dir)
        champion = second.wait()
        step("8/8 an A/B test with a shadow through the server, online accuracy")
        online_experiment(data_dir, last, int(champion))
    else:
        step("6/8 to 8/8 skipped: no champion to serve (the gate kept the version a challenger)")
    click.echo(f"done in {time.monotonic() - started:.0f} s\n")
    print_summary(data_dir, first, last)


def start_ray_quietly(data_dir: Path) -> None:
    """The runs' in-process Ray, started before them without its workers' output in this terminal (Ray
    Train's and Ray Data's progress, hundreds of lines); it stays in Ray's session folder."""
    import logging

    import ray.data  # configures its loggers on import: quieten them after

    from orchestration.profiles import open_resource

    with open_resource("ray", str(data_dir)) as resource:
        resource.model_copy(update={"log_to_driver": False}).ensure_started()
    # and Ray Train's lines of a training in this process (a worker's went to its log file)
    for name in ("ray.data", "ray.train"):
        logging.getLogger(name).setLevel(logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False


def hide_library_deprecations() -> None:
    """Python's default again: DeprecationWarnings shown for __main__ only. Importing Feast shows every one
    of the process (`warnings.simplefilter("once", DeprecationWarning)` in feast/feature_view.py): Dagster's
    calls of its own deprecated APIs, ibis', SQLAlchemy's and Ray's, twenty lines of a new user's terminal.
    The tests still show them."""
    import warnings

    import feast  # noqa: F401 - its filter now, not in the middle of a run, ahead of these

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")


def embeddings_and_search(data_dir: Path, first: date, last: date) -> None:
    """Train the compact CLIP model and register it (the model server's clip_text, clip_image and
    content_violation serve the champion), embed the days' items into the vector store, and search for
    one catalogue item's title."""
    # one CPU: the other core is step 2's; in this process (TRAIN_WORKERS)
    ops = {"clip_model": {"config": {"epochs": CLIP_EPOCHS, "cpus_per_worker": 1, "num_workers": TRAIN_WORKERS}}}
    result = run_job(None, ["clip_model", "models/clip"], ops=ops)
    if not result.success:
        raise click.ClickException("the clip_model run failed; see `mlplane ui`")
    recall = materialized(result, "clip_model")
    click.echo(
        f"   CLIP ({CLIP_EPOCHS} epochs): held-out text-to-image recall@10 {recall['recall@10']:.2f} "
        f"(random {recall['random_recall@10']:.2f})"
    )
    embeddings = [EMBEDDINGS, VIOLATION_FLAGS, "vectors/items"]
    if not run_job("item_embeddings_daily", embeddings, tags=day_range(first, last)).success:
        raise click.ClickException("the item embeddings run failed; see `mlplane ui`")
    search_for_an_item(data_dir)


def search_for_an_item(data_dir: Path) -> None:
    import random

    from engines.data.lake import Lake
    from engines.retrieval import clip_registry
    from engines.retrieval.embeddings import current_catalogue
    from engines.retrieval.search import ItemSearch
    from orchestration.profiles import open_resource

    lake = Lake(data_dir)
    catalogue = current_catalogue(lake)
    item = catalogue.row(random.Random(7).randrange(catalogue.height), named=True)
    with open_resource("model_registry", str(data_dir)) as registry:
        spec, version, _ = clip_registry.champion(registry.get_client(), clip_registry.cache_folder(lake.root))
    with open_resource("vector_store", str(data_dir)) as vectors, vectors.get_client() as store:
        hits = ItemSearch(store, spec, model_version=version).search(text=item["title"], k=10)
    found = [h.payload.get("item_id", h.id) for h in hits]
    rank = f"ranks #{found.index(item['item_id']) + 1}" if item["item_id"] in found else "is not in the top 10"
    click.echo(f'   mlplane search "{item["title"]}": item {item["item_id"]} (that title\'s own item) {rank}; top 3:')
    for hit in hits[:3]:
        click.echo(f"     {hit.payload.get('item_id', hit.id):>6}  {hit.score:.3f}  {hit.payload.get('title')}")


def labeling_round(data_dir: Path, first: date, last: date) -> None:
    """Fill the content_violation queues, let simulated annotators and a reviewer label them through the
    labeling app, release the labels, and flag the catalogue again against the release."""
    from demo.labeling_round import TASK, simulated_round
    from engines.data.releases import newest_release
    from ground_truth.server import serve_app
    from orchestration.profiles import open_resource

    if not run_job("ground_truth_queues", [f"ground_truth/{TASK}/queue"], tags=day_range(first, last)).success:
        raise click.ClickException("the labeling queue run failed; see `mlplane ui`")
    with open_resource("labels", str(data_dir)) as labels, serve_app(labels.database_url()) as url:
        done = simulated_round(labels.get_client(), url, data_dir, annotators=4, accuracy=ANNOTATOR_ACCURACY)
    click.echo(
        f"   {done.answers} answers by 4 simulated annotators ({ANNOTATOR_ACCURACY:.1%} accurate) through the app, "
        f"{done.disputes_settled} disputes settled by a reviewer"
    )
    if not run_job(None, [f"ground_truth/{TASK}/release"]).success:  # its blocking checks refused it
        click.echo("   no release: its checks refused the labels (agreement or class balance; the run in the UI)")
        return
    release = newest_release(data_dir, TASK)
    manifest = release.manifest()
    click.echo(
        f"   release {release.name}: {manifest['items']} items {manifest['class_counts']}, "
        f"Krippendorff's alpha {manifest['agreement']['krippendorff_alpha']:.2f}"
    )
    flagging = [VIOLATION_FLAGS, "vectors/items", VIOLATION_ACCURACY]
    result = run_job("item_embeddings_daily", flagging, tags=day_range(first, last))
    if not result.success:
        raise click.ClickException("the violation flags run failed; see `mlplane ui`")
    flags = materialized(result, VIOLATION_FLAGS)
    threshold = f"{flags['threshold']:.3f}" if "threshold" in flags else "none"
    click.echo(
        f"   copy flags (each item against earlier items of other creators): {flags['flagged']} flagged, "
        f"threshold {threshold} ({flags['threshold_source']})"
    )
    click.echo(f"   {VIOLATION_ACCURACY} on the release's random audit sample: {audit_accuracy(data_dir, first, last)}")


def audit_accuracy(data_dir: Path, first: date, last: date) -> str:
    """The detector's precision and recall on the audit items of the days, pooled, with 95% intervals."""
    import polars as pl

    from engines.data.lake import Lake
    from engines.safety.content_violation import AUDIT
    from engines.safety.violation_accuracy import Rate

    lake = Lake(data_dir)
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    audit = pl.concat([lake.read_partition(*VIOLATION_ACCURACY.split("/"), d) for d in days]).filter(slice=AUDIT)
    tp, flagged, violations = (int(audit[c].sum()) for c in ("true_positives", "flagged", "violations"))
    said = []
    for name, rate in (("precision", Rate(tp, flagged)), ("recall", Rate(tp, violations))):
        low, high = rate.interval
        said.append(f"{name} {rate.value:.2f} [{low:.2f}, {high:.2f}]" if rate.trials else f"{name} n/a")
    return f"{audit['items'].sum()} items, {violations} violations, {', '.join(said)} (threshold set on this release)"


def materialized(result, key: str) -> dict:
    """The metadata values of `key`'s materialization in a run's result."""
    from dagster import AssetKey

    event = next(e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey(key.split("/")))
    return {k: v.value for k, v in event.materialization.metadata.items()}


def day_range(first: date, last: date) -> dict[str, str]:
    from orchestration.dagster_internals import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    return {ASSET_PARTITION_RANGE_START_TAG: first.isoformat(), ASSET_PARTITION_RANGE_END_TAG: last.isoformat()}


def train_and_gate(data_dir: Path, last: date, training_days: int = 7, cpus: int | None = None) -> str | None:
    """The train_personalization job for the newest day (on up to `training_days` days, its worker on `cpus`
    of Ray's CPUs, None: all); the champion's version afterwards, if any."""
    from engines.models.registry import ModelRegistry

    config = {"training_days": training_days, "cpus_per_worker": cpus, "num_workers": TRAIN_WORKERS}
    ops = {f"models__{MODEL}": {"config": config}}
    run_job(f"train_{MODEL}", None, partition=last, ops=ops, refusal_expected=True)
    registry = ModelRegistry.local(data_dir / "registry")
    for version in registry.versions(MODEL):
        metrics = {k: round(v, 3) for k, v in version.metrics.items()}
        click.echo(f"   v{version.version} [{','.join(version.aliases) or '-'}] {metrics}")
    champion = registry.by_alias(MODEL, "champion")
    return champion.version if champion else None


def create_registry_store(data_dir: Path) -> None:
    """The MLflow registry's SQLite store, created on the main thread before the runs of two threads start.
    Created by the first training while the labeling round ran, MLflow's schema creation failed once ("SQLite
    objects created in a thread can only be used in that same thread", then "table
    _alembic_tmp_experiments already exists"); created here first, it has not failed since."""
    from engines.models.registry import ModelRegistry

    ModelRegistry.local(data_dir / "registry")


def live_recommendation(data_dir: Path) -> None:
    """Start the model server over the lake, ask it for one active user's top 5, stop it."""
    import httpx

    from engines.data.lake import Lake
    from engines.models.batch_inference import active_users
    from serving.models.background import running_model_server
    from serving.models.config import ServerConfig

    lake = Lake(data_dir)
    user = active_users(lake, max(lake.partition_days("warehouse", "interactions")))[0]
    config = ServerConfig.local(data_dir, feature_log_sample=0.0)
    config.models = [m for m in config.models if m.name == MODEL]  # the champion's towers: no CLIP needed here
    with running_model_server(config) as url:
        answer = httpx.post(f"{url}/recommend", json={"user_id": user, "k": 5}, timeout=60)
        answer.raise_for_status()
    body = answer.json()
    click.echo(
        f'   POST /recommend {{"user_id": {user}, "k": 5}} -> items {body["items"]} '
        f"(scores {[round(s, 3) for s in body['scores']]}), model version {body['model_version']}, "
        f"{body['timings_ms']['total']:.1f} ms"
    )


def online_experiment(data_dir: Path, last: date, champion: int, requests: int = 300) -> None:
    """Serve the champion against the newest other version (half the users each, the other also shadowing
    every request), let the simulated users react, and print the online accuracy."""
    from demo.online_experiment import (
        ACCURACY_COLUMNS,
        COMPARISON_COLUMNS,
        ab_with_shadow,
        run_experiment,
        table_text,
    )
    from engines.models.registry import ModelRegistry

    versions = [int(v.version) for v in ModelRegistry.local(data_dir / "registry").versions(MODEL)]
    other = max(v for v in versions if v != champion)
    click.echo(f"   v{champion} (champion) against v{other}, half the users each; v{other} also shadows every request")
    experiments = ab_with_shadow({"model_alias": "champion"}, {"model_version": other}, {"model_version": other})
    result = run_experiment(
        data_dir,
        experiments,
        requests,
        lambda day: run_job("online_monitoring", None, partition=day).success,
        say=click.echo,
    )
    click.echo(f"   monitoring/online_accuracy {result.day} (CTR@10 and NDCG@10 with 95% intervals):")
    click.echo(table_text(result.accuracy, ACCURACY_COLUMNS))
    click.echo(table_text(result.comparisons, COMPARISON_COLUMNS))


def materialize_catalogue(first: date, last: date) -> None:
    """The feature registry, then the catalogue (`warehouse/items`) over the range: all the CLIP lane needs."""
    from assets.embeddings import WAREHOUSE_ITEMS

    run_or_fail("feature_store_refresh", ["feature_registry"])
    run_or_fail("daily_pipeline", [WAREHOUSE_ITEMS.to_user_string()], day_range(first, last))


def materialize_data(first: date, last: date) -> None:
    """After the catalogue: every other daily asset over the range in one run, the windows of the streaming
    views the training set reads over the same days (one Flink batch job), the training sets of the days
    whose next day is there (a day's labels look past its midnight; the last day's waits for the next
    day's interactions), then the data-quality report."""
    from dagster import AssetSelection

    from assets.embeddings import WAREHOUSE_ITEMS
    from assets.streaming import history_key
    from feature_defs.services import personalization_ranking
    from jobs import daily_assets
    from orchestration.definitions import defs

    days, labelled = day_range(first, last), day_range(first, last - timedelta(days=1))
    rest = (daily_assets - AssetSelection.assets(WAREHOUSE_ITEMS)).resolve(defs.resolve_asset_graph())
    # the histories the training set reads; item_sales_today's (a running total: every item of the day at
    # every slide, two thirds of the backfill's rows and time) waits for a user to select it in the UI
    histories = [history_key(v.name).to_user_string() for v in personalization_ranking.views if v.streaming]
    run_or_fail("daily_pipeline", sorted(k.to_user_string() for k in rest), days, shown="the rest")
    run_or_fail("streaming_backfill", histories, days)
    if last > first:
        run_or_fail("training_data", ["datasets/personalization_training"], labelled)
    run_or_fail("feature_store_refresh", ["data_quality_report"])


def run_or_fail(job_name: str, selection: list[str], tags: dict | None = None, shown: str | None = None) -> None:
    if not run_job(job_name, selection, tags=tags, shown=shown).success:
        raise click.ClickException(f"the run of {job_name} failed; see `mlplane ui`")


def run_job(
    job_name: str | None,
    selection: list[str] | None,
    tags: dict | None = None,
    partition: date | None = None,
    ops: dict | None = None,
    shown: str | None = None,
    refusal_expected: bool = False,
):
    """One run of a definitions job (None: the assets' implicit job, as `dagster asset materialize`) in
    this process, recorded in the instance (the UI shows it); `ops` is the run config of its ops, `shown`
    what the terminal calls the selection (default: its keys). A run whose blocking checks may refuse
    (`refusal_expected`: a gate) says so in one line instead of Dagster's error log with its stack trace.
    A run on a `Background` lane does not capture its steps' stdout and stderr (the UI shows its logs
    only): Dagster's local capture redirects the process's file descriptors, so only one run at a time in
    a process may capture (a second one's cleanup waits twice 30 s for its `tail` process, then fails);
    the main thread's runs do."""
    from dagster import AssetKey, DagsterInstance

    from orchestration.dagster_internals import NO_CAPTURE_LOG_MANAGER, ConfigurableClassData
    from orchestration.definitions import defs

    instance = DagsterInstance.get()
    if threading.current_thread() is not threading.main_thread():
        no_capture = ConfigurableClassData(*NO_CAPTURE_LOG_MANAGER, "{}")
        instance = DagsterInstance.from_ref(instance.get_ref()._replace(compute_logs_data=no_capture))

    keys = [AssetKey(k.split("/")) for k in selection] if selection else None
    shown = shown or (", ".join(selection) if selection else None)
    click.echo(f"   running {job_name or 'materialize'}{' ' + shown if shown else ''} ...")
    job = defs.resolve_job_def(job_name) if job_name else defs.resolve_implicit_global_asset_job_def()
    log_level = "CRITICAL" if refusal_expected else "INFO"
    result = job.execute_in_process(
        instance=instance,
        tags=tags or {},
        asset_selection=keys,
        raise_on_error=False,
        partition_key=partition.isoformat() if partition else None,
        run_config={"loggers": {"console": {"config": {"log_level": log_level}}}, **({"ops": ops} if ops else {})},
    )
    if refusal_expected and not result.success:
        click.echo(f"   {refusal(result)} (run {result.run_id[:8]} in the UI)")
    return result


def refusal(result) -> str:
    """One line for a run that failed: the blocking checks that refused, else the first step's error."""
    refused = [
        f"{e.asset_key.to_user_string()} {e.check_name}" for e in result.get_asset_check_evaluations() if not e.passed
    ]
    if refused:
        return f"refused by {', '.join(refused)}: it stays a challenger"
    failures = [e for e in result.all_events if e.is_step_failure]
    error = failures[0].step_failure_data.error if failures else None
    while error is not None and error.cause is not None:  # Dagster wraps the step's own exception
        error = error.cause
    return f"failed: {error.message.strip().splitlines()[0] if error else 'see the run'}"


def remember_landed_days(data_dir: Path, first: date, last: date) -> None:
    """Leave the landing sensor's cursor at the days just run, so `mlplane ui` does not run them again."""
    from dagster import DagsterInstance

    from engines.data.lake import Lake
    from orchestration.home import set_sensor_cursor
    from orchestration.sensors import landing_cursor, landing_sensor

    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    with DagsterInstance.get() as instance:
        set_sensor_cursor(instance, landing_sensor.name, landing_cursor(Lake(data_dir), days))


def print_summary(data_dir: Path, first: date, last: date) -> None:
    import polars as pl

    from engines.data.quality import QualityEngine
    from engines.data.releases import newest_release

    click.echo("What was produced:")
    for zone in SUMMARY_ZONES:
        for table_dir in sorted((data_dir / zone).glob("*")):
            files = sorted(table_dir.glob("date=*/part-0.parquet"))
            if not files:
                continue
            rows = sum(pl.scan_parquet(f).select(pl.len()).collect().item() for f in files)
            click.echo(f"  {zone + '/' + table_dir.name:<42} {len(files):>3} partitions {rows:>10,} rows")
    click.echo(
        f"  feature store: Feast repo in {data_dir / 'feature_repo'} (feast -c {data_dir / 'feature_repo'} "
        "feature-views list)"
    )
    release = newest_release(data_dir, "content_violation")
    if release is not None:
        click.echo(f"  ground truth: content_violation release {release.name} in {release.folder}")
    quality = QualityEngine(data_dir / "quality")
    latest = quality.latest_results()
    failing = [r["suite"] for r in latest if not r["success"]]
    listed = f": {', '.join(failing)}" if failing else ""
    click.echo(f"\nData quality: {len(latest)} suites, {len(failing)} failing{listed}")
    click.echo(f"Data-quality report: {quality.docs_index_path}")
    click.echo("\nWhat to open next:")
    click.echo(f"  .venv/bin/mlplane ui     then http://127.0.0.1:3000: the lineage, each run of {first} .. {last}")
    click.echo('  .venv/bin/mlplane search "a red chair" -k 5    the catalogue\'s search (Qdrant collection `items`)')
    click.echo("  .venv/bin/mlplane serve models                the model server the demo started for a moment")
    click.echo("  docs/                    a page per system: features, streaming, models, serving, ground truth")
