"""The Ray pipelines on a real two-node cluster (tests/ray_cluster.py), joined through the prod
profile's Ray resource (MLPLANE_RAY_ADDRESS): Ray Train with one worker per node, the CLIP embedding
pipeline and batch inference with the second node killed mid-job. Every row is checked against an
independent recomputation in this process; nothing may be lost or written twice."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from datetime import datetime

import numpy as np
import polars as pl
import psutil
import pytest
import ray
import torch

from engines.models import batch_inference as engine
from engines.retrieval.embeddings import EmbedConfig, embed_items
from engines.retrieval.vector_store import VectorStore
from ml import personalization as p13n
from ml.clip import (
    ClipSpec,
    TrainConfig,
    encode_images,
    encode_texts,
    load_model,
    preprocess_image,
    tokenizer,
    train_clip,
)
from orchestration.profiles import resources_for
from tests.conftest import SMALL, simulate
from tests.ray_cluster import NODE_CPUS, WORKER_RESOURCE, RayCluster, running_cluster, wait_for_nodes
from tests.untrained import with_drawn_outputs

K = 5


@pytest.fixture(scope="module")
def ray_cluster():
    """Module-scoped, so its two nodes stop before the next module starts its own engines."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def on_cluster(ray_cluster: RayCluster, tmp_path_factory):
    """This process joined to the cluster as the prod profile does, and a small simulated catalogue
    in a folder both nodes read (shared storage)."""
    data_dir = tmp_path_factory.mktemp("cluster_lake")
    simulate(data_dir, days=1, config=SMALL)
    ray.shutdown()  # another module's in-process Ray, if any: a driver joins one cluster at a time
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLPLANE_RAY_ADDRESS", ray_cluster.address)
        with resources_for("prod", data_dir=str(data_dir))["ray"].process_config_and_initialize_cm() as resource:
            assert resource.address == ray_cluster.address
            resource.ensure_started()
            ray.data.DataContext.get_current().enable_progress_bars = False
            wait_for_nodes(2)
            yield {"dir": data_dir, "landing": data_dir / "landing"}
    ray.shutdown()


def items_of(landing) -> pl.DataFrame:
    return pl.read_parquet(landing / "items" / "*" / "*.parquet").unique("item_id").sort("item_id")


def node_ids() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def test_ray_train_runs_one_worker_on_each_node(on_cluster):
    items = items_of(on_cluster["landing"]).head(96)
    spec = ClipSpec()
    pixels = np.stack([preprocess_image((on_cluster["landing"] / p).read_bytes(), 64) for p in items["thumbnail_path"]])
    output = on_cluster["dir"] / "models" / "clip.pt"
    history = train_clip(
        spec,
        pixels,
        items["title"].to_list(),
        TrainConfig(epochs=2, batch_size=16, num_workers=2, placement_strategy="STRICT_SPREAD"),
        output,
        storage=on_cluster["dir"] / "ray_train",
    )
    nodes = history[-1]["worker_nodes"]
    assert len(nodes) == 2 and set(nodes) == node_ids()
    assert all(np.isfinite(h["loss"]) for h in history)
    trained = load_model(ClipSpec(spec.model_name, str(output)))  # the checkpoint came back through storage
    assert (
        sum(
            float((a - b).abs().sum())
            for a, b in zip(trained.state_dict().values(), load_model(spec).state_dict().values())
        )
        > 0
    )


def kill_second_node_mid_job(cluster: RayCluster, job) -> tuple[object, bool]:
    """Run `job` in a thread; once one of the job's tasks runs on the second node, SIGKILL that
    node. Returns the job's result and whether the job was still running when the node died. The
    cluster gets a fresh second node afterwards."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(value=job()), daemon=True)
    thread.start()
    root = psutil.Process(cluster.worker.pid)
    busy = False
    while thread.is_alive() and not busy:
        for proc in root.children(recursive=True):
            try:
                title = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            busy = busy or (title.startswith("ray::") and "IDLE" not in title)
        time.sleep(0.02)
    running = thread.is_alive()
    cluster.kill_worker()
    thread.join(timeout=600)
    assert not thread.is_alive(), "the job did not finish after the node was lost"
    cluster.start_worker()
    wait_for_nodes(2)
    return result.get("value"), running and busy


def test_embeddings_lose_and_duplicate_nothing_when_a_node_dies(on_cluster, ray_cluster):
    items = items_of(on_cluster["landing"])
    checkpoint = on_cluster["dir"] / "models" / "random.pt"  # shared storage: any node could read it
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    torch.save(load_model(ClipSpec()).state_dict(), checkpoint)
    spec = ClipSpec(checkpoint=str(checkpoint))
    config = EmbedConfig(read_block_rows=16)  # many blocks: the job outlives the node
    out, killed_mid_job = kill_second_node_mid_job(
        ray_cluster, lambda: embed_items(items, on_cluster["landing"], spec, config, "v")
    )
    assert killed_mid_job, "the second node was not running the job when it was killed"
    assert out["item_id"].to_list() == items["item_id"].to_list()  # once each, none lost
    # independent recomputation of a random sample in this process
    model, rng = load_model(spec), np.random.default_rng(3)
    sample = out.filter(pl.col("skip_reason").is_null()).sample(12, seed=int(rng.integers(1 << 30)))
    rows = items.filter(pl.col("item_id").is_in(sample["item_id"].implode())).sort("item_id")
    pixels = np.stack([preprocess_image((on_cluster["landing"] / p).read_bytes(), 64) for p in rows["thumbnail_path"]])
    sample = sample.sort("item_id")
    assert np.allclose(np.stack(sample["image_embedding"].to_numpy()), encode_images(model, pixels), atol=1e-5)
    texts = encode_texts(model, tokenizer(spec)(rows["title"].to_list()).numpy())
    assert np.allclose(np.stack(sample["text_embedding"].to_numpy()), texts, atol=1e-5)


def small_model(users: int, items: int) -> tuple[p13n.PersonalizationModel, pl.DataFrame, pl.DataFrame]:
    """An untrained two-tower model over one numeric feature per side, with its users and items."""
    rng = np.random.default_rng(5)
    user_col, item_col = f"{p13n.USER_INPUTS[0].view}__score", f"{p13n.ITEM_INPUTS[0].view}__price"
    train = pl.DataFrame(
        {
            "user_id": rng.integers(0, users, 500),
            "item_id": rng.integers(0, items, 500),
            user_col: rng.normal(size=500),
            item_col: rng.normal(size=500),
        }
    )
    torch.manual_seed(0)
    model = p13n.PersonalizationModel(with_drawn_outputs(p13n.TwoTower(p13n.build_spec(train, p13n.TrainConfig()))))
    return (
        model,
        pl.DataFrame({"user_id": np.arange(users), user_col: rng.normal(size=users)}),
        pl.DataFrame({"item_id": np.arange(items), item_col: rng.normal(size=items)}),
    )


def test_batch_inference_loses_and_duplicates_nothing_when_a_node_dies(on_cluster, ray_cluster, tmp_path):
    model, users, items = small_model(users=20_000, items=300)
    with VectorStore.open(str(tmp_path / "vectors")) as store:  # the driver's index, copied to the workers
        radius = engine.index_items(store, model, items, "1")
        out, killed_mid_job = kill_second_node_mid_job(
            ray_cluster, lambda: engine.recommend(users, store, model, "1", radius, K, engine="ray", batch_size=400)
        )
        local = engine.recommend(users, store, model, "1", radius, K, engine="local")
    assert killed_mid_job, "the second node was not running the job when it was killed"
    result = engine.coverage(out, users["user_id"].to_list(), set(items["item_id"].to_list()))
    assert result.missing_users == [] and result.duplicate_users == [] and result.unknown_items == []
    assert out.height == users.height * K
    key = ["user_id", "rank"]
    assert out.sort(key).select(*key, "item_id").equals(local.sort(key).select(*key, "item_id"))
    # exact inner-product top-k for random users, in numpy
    scores = model.user_vectors(users) @ model.item_vectors(items).T
    for user in np.random.default_rng(4).choice(users.height, 10, replace=False).tolist():
        top = np.argsort(-scores[user])[:K].tolist()
        assert out.filter(pl.col("user_id") == user).sort("rank")["item_id"].to_list() == top


# --- training that survives the loss of its node -------------------------------------------------------
def clicks_frame(rows: int, seed: int) -> pl.DataFrame:
    """Impressions with a planted taste: a user clicks an item of its region's category far more often."""
    rng = np.random.default_rng(seed)
    regions, categories = ["eu", "us", "apac"], ["art", "game", "toy"]
    users, items = rng.integers(0, 300, rows), rng.integers(0, 200, rows)
    region, category = users % 3, items % 3
    clicked = rng.random(rows) < np.where(region == category, 0.6, 0.1)
    return pl.DataFrame(
        {
            "user_id": users,
            "item_id": items,
            "event_timestamp": [datetime(2026, 1, 1 + int(d)) for d in rng.integers(0, 3, rows)],
            "user_profile__region": [regions[r] for r in region],
            "user_engagement__clicks_7d": rng.poisson(3, rows).astype(float),
            "item_content__price": rng.gamma(2.0, 5.0, rows),
            "item_content__category": [categories[c] for c in category],
            "label_click": clicked,
            "label_play": np.zeros(rows, dtype=bool),
        }
    )


@ray.remote(num_cpus=NODE_CPUS, resources={"head": 1})
class HeadCpus:
    """Holds the head's CPUs, so that the training worker can only run on the second node."""

    def ready(self) -> bool:
        return True


def registered_epochs(storage, run: str, count) -> int:
    """Epochs in the newest checkpoint Ray Train has registered for the run (0: none yet), from the snapshot
    its controller writes to the run's storage: a checkpoint the worker uploaded but the controller had not
    yet received when the node died is not one a restart resumes from. `count(metrics)` reads one."""
    try:
        latest = json.loads((storage / run / "checkpoint_manager_snapshot.json").read_text())[
            "latest_checkpoint_result"
        ]
    except (OSError, ValueError, KeyError):
        return 0
    return count(latest["metrics"]) if latest else 0


def train_losing_the_node(cluster: RayCluster, storage, run: str, count, job) -> tuple[object, int, set[str]]:
    """Run the training `job` with the head's CPUs held, so that its worker runs on the second node; SIGKILL
    that node once the run has persisted a checkpoint, and start a replacement. Returns the job's result,
    the epochs checkpointed when the node died and the lost node's id."""
    lost = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(WORKER_RESOURCE)}
    head = HeadCpus.remote()
    ray.get(head.ready.remote())
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(value=job()), daemon=True)
    thread.start()
    while thread.is_alive() and registered_epochs(storage, run, count) == 0:
        time.sleep(0.05)
    cluster.kill_worker()
    before_loss = registered_epochs(storage, run, count)
    cluster.start_worker()  # the replacement node the restarted run waits for
    thread.join(timeout=600)
    ray.kill(head)
    wait_for_nodes(2)
    assert not thread.is_alive() and len(lost) == 1
    return result.get("value"), before_loss, lost


def test_training_resumes_from_the_last_epoch_after_its_node_dies(on_cluster, ray_cluster, tmp_path):
    """One Ray Train worker, on the second node; the node is SIGKILLed once the run has a checkpoint. The
    run restarts on a new node from that checkpoint: every epoch trained once (the ones before the loss on
    the lost node, the rest on its replacement), and the same model as a run that never stopped (the
    checkpoint holds the optimizer and the random streams, so training continues exactly)."""
    train_rows, held_out = clicks_frame(30_000, seed=1), p13n.labelled(clicks_frame(5_000, seed=2))
    # no taste head (dim 8 has no room for it) and the light weight decay such a small tower learns with;
    # every epoch trains (patience: all of them), the epoch selection resumed with the rest
    config = p13n.TrainConfig(
        epochs=6, batch_size=256, dim=8, hidden=32, cpus_per_worker=1, taste=False, weight_decay=1e-4, patience=6
    )
    storage = on_cluster["dir"] / "ray_train_resume"
    run, before_loss, lost = train_losing_the_node(
        ray_cluster,
        storage,
        "personalization",
        lambda m: len(m["loss_curve"]),
        lambda: p13n.train(train_rows, config, storage),
    )
    assert 1 <= before_loss < config.epochs, "the node was not lost mid-training"
    # each epoch once: the checkpointed ones on the lost node, then the replacement from the next epoch on
    assert len(run.loss_curve) == len(run.epoch_nodes) == config.epochs
    assert set(run.epoch_nodes[:before_loss]) == lost, run.epoch_nodes
    assert len(set(run.epoch_nodes[before_loss:]) - lost) == 1, run.epoch_nodes
    # the run that never stopped: Ray Train's local mode, same rows, seed and threads
    uninterrupted = p13n.train(train_rows, dataclasses.replace(config, num_workers=0), tmp_path / "local")
    assert run.loss_curve == pytest.approx(uninterrupted.loss_curve, rel=1e-5)
    auc = {name: roc_auc(held_out, m.model) for name, m in (("resumed", run), ("uninterrupted", uninterrupted))}
    assert auc["resumed"] > 0.65 and abs(auc["resumed"] - auc["uninterrupted"]) <= 0.005, auc


def test_clip_training_resumes_from_the_last_epoch_after_its_node_dies(on_cluster, ray_cluster, tmp_path):
    """The same for CLIP: restarted from the checkpoint (weights, optimizer, learning-rate schedule), each
    epoch once, and a final loss within noise of a run that never stopped (Ray Data may hand the batches
    over in another order)."""
    items = items_of(on_cluster["landing"]).head(96)
    pixels = np.stack([preprocess_image((on_cluster["landing"] / p).read_bytes(), 64) for p in items["thumbnail_path"]])
    titles, config = items["title"].to_list(), TrainConfig(epochs=6, batch_size=16, num_workers=1)
    storage, output = on_cluster["dir"] / "clip_resume", tmp_path / "clip.pt"
    history, before_loss, lost = train_losing_the_node(
        ray_cluster,
        storage,
        "clip",
        lambda metrics: metrics["epoch"],
        lambda: train_clip(ClipSpec(), pixels, titles, config, output, storage),
    )
    assert 1 <= before_loss < config.epochs, "the node was not lost mid-training"
    assert [h["epoch"] for h in history] == list(range(1, config.epochs + 1))
    nodes = [h["node"] for h in history]
    assert set(nodes[:before_loss]) == lost and len(set(nodes[before_loss:]) - lost) == 1, nodes
    local = dataclasses.replace(config, num_workers=0)
    uninterrupted = train_clip(ClipSpec(), pixels, titles, local, tmp_path / "local.pt", tmp_path / "local")
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["loss"] == pytest.approx(uninterrupted[-1]["loss"], rel=0.05), (history, uninterrupted)


def roc_auc(rows: pl.DataFrame, model: p13n.PersonalizationModel) -> float:
    """Mann-Whitney AUC of the model's scores for the held-out labels (ties count half)."""
    scores, labels = model.score(rows), rows[p13n.LABEL].to_numpy() > 0
    ranks = pl.Series(scores).rank("average").to_numpy()
    positives = labels.sum()
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * (len(labels) - positives)))
