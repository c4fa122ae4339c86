"""Real-time recommendations, CLIP encoders and the content-violation scorer on the platform's own
models (trained and registered by their Dagster assets), checked against recomputations apart from
the server; the served features' skew check through Dagster."""

from __future__ import annotations

import json
import random

import httpx
import numpy as np
import pandas as pd
import polars as pl
import tritonclient.http as triton
from dagster import AssetSelection, DagsterInstance, materialize

from assets import all_assets
from assets.serving import SERVED_FEATURES, SKEW_CHECK
from engines.data.lake import Lake
from engines.models.batch_inference import entity_features, existing_items
from engines.models.registry import ModelRegistry
from feature_defs import personalization_ranking
from ml.personalization import PersonalizationModel
from tests.conftest import local_resources

USER_VIEWS = [v for v in personalization_ranking.views if v.join_keys == ["user_id"]]
PLAYED = "user_activity_realtime__last_played_items_1h"
WRITTEN_ONLY_ONLINE: set[int] = set()


def online_user_features(server, user_id: int) -> dict:
    """Feast's SDK read (the reference path) of the service's user-keyed views, streaming included."""
    references = [f"{v.name}:{f}" for v in USER_VIEWS for f in v.feature_names]
    values = server.feature_store.store.get_online_features(
        features=references, entity_rows=[{"user_id": user_id}], full_feature_names=True
    ).to_dict()
    return {k: v[0] for k, v in values.items()}


def expected_top_k(lake_root, tmp_path, features: dict, k: int, exclude: set[int]) -> tuple[list[int], np.ndarray]:
    """The champion from the registry, every catalogue item scored by brute force, the best k kept."""
    registry = ModelRegistry.local(lake_root / "registry")
    version = registry.by_alias("personalization", "champion").version
    model = PersonalizationModel.load(registry.load("personalization", version, tmp_path / "champion"))
    lake = Lake(lake_root)
    day = max(lake.partition_days("offline", "item_content"))
    items = entity_features(lake, day, model.spec.item.columns, "item_id", sorted(existing_items(lake, day))).frame
    user = pl.DataFrame({c: [features.get(c)] for c in model.spec.user.columns})
    scores = model.item_vectors(items) @ model.user_vectors(user)[0]
    ids = items["item_id"].to_numpy()
    keep = ~np.isin(ids, list(exclude))
    order = np.lexsort((ids[keep], -scores[keep]))[:k]  # the server's tie-break: item id
    return ids[keep][order].tolist(), scores[keep][order]


def test_recommend_is_the_models_top_k_over_online_features(platform_server, served_lake, tmp_path):
    server, url = platform_server.server, platform_server.url
    users = (
        Lake(served_lake)
        .scan_partitions("warehouse", "users", Lake(served_lake).partition_days("warehouse", "users"))
        .select("user_id")
        .unique()
        .collect()["user_id"]
        .to_list()
    )
    rng = random.Random(12)
    chosen = rng.sample(users, 4)
    # the streaming view, written as the streaming job's pusher writes it: the user just played two items
    top, _ = expected_top_k(served_lake, tmp_path, online_user_features(server, chosen[0]), 3, set())
    WRITTEN_ONLY_ONLINE.add(chosen[0])
    server.feature_store.load_online(
        "user_activity_realtime",
        pd.DataFrame(
            {
                "user_id": [chosen[0]],
                "impressions_1h": [4],
                "clicks_1h": [2],
                "plays_1h": [2],
                "ctr_1h": [0.5],
                "last_played_items_1h": [top[:2]],
                "event_timestamp": [pd.Timestamp.now(tz="UTC")],
            }
        ),
    )
    for user_id in chosen:
        features = online_user_features(server, user_id)
        exclude = {int(i) for i in features.get(PLAYED) or []}
        answer = httpx.post(f"{url}/recommend", json={"user_id": user_id, "k": 5, "context": {"page": "home"}})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        ids, scores = expected_top_k(served_lake, tmp_path, features, 5, exclude)
        assert body["items"] == ids and body["model_version"] == "1" and body["model_name"] == "personalization"
        np.testing.assert_allclose(body["scores"], scores, rtol=1e-4, atol=1e-5)
        assert not set(body["items"]) & exclude
    streamed = httpx.post(f"{url}/recommend", json={"user_id": chosen[0], "k": 5}).json()
    assert not set(streamed["items"]) & set(top[:2])  # what was just played is not recommended again

    client = triton.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_model_ready("recommend")
    user_ids = triton.InferInput("user_id", [2], "INT64")
    user_ids.set_data_from_numpy(np.array(chosen[1:3], np.int64))
    k = triton.InferInput("k", [1], "INT32")
    k.set_data_from_numpy(np.array([5], np.int32))
    result = client.infer("recommend", [user_ids, k])
    for row, user_id in enumerate(chosen[1:3]):
        rest = httpx.post(f"{url}/recommend", json={"user_id": user_id, "k": 5}).json()
        assert result.as_numpy("item_ids")[row].tolist() == rest["items"]
    assert result.as_numpy("model_version").tolist() == [b"1", b"1"]
    for bad, message in [
        ({"user_id": "x"}, "user_id"),
        ({"user_id": 1, "k": 0}, "k"),
        ({"user_id": 1, "context": {"exclude_item_ids": ["a"]}}, "exclude_item_ids"),
    ]:
        response = httpx.post(f"{url}/recommend", json=bad)
        assert response.status_code == 400 and message in response.json()["error"], response.text


def test_item_scores_are_the_dot_products_of_the_towers(platform_server, served_lake, tmp_path):
    url = platform_server.url
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    metadata = client.get_model_metadata("personalization")
    assert metadata["parameters"]["catalogue_items"] > 0
    answer = httpx.post(f"{url}/recommend", json={"user_id": 3, "k": 4}).json()
    served = platform_server.server.repository.get("personalization").model
    features = online_user_features(platform_server.server, 3)
    inputs = []
    for spec in metadata["inputs"]:
        name = spec["name"]
        if name == "item_ids":
            array = np.array([answer["items"]], np.int64)
        elif spec["datatype"] == "BYTES":
            array = np.array([str(features.get(name)).encode()], dtype=object)
        elif len(spec["shape"]) == 2:
            array = np.array([features.get(name) or [-1]], np.int64)
        else:
            value = features.get(name)
            array = np.array(
                [np.nan if value is None else value], np.int64 if spec["datatype"] == "INT64" else np.float64
            )
        tensor = triton.InferInput(name, list(array.shape), spec["datatype"])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    scores = client.infer("personalization", inputs).as_numpy("item_scores")[0]
    # the same scores recommend ranked by (a missing categorical arrives as 'None': unknown to the model too)
    np.testing.assert_allclose(scores, answer["scores"], rtol=1e-4, atol=1e-5)
    assert served.items is not None


def test_clip_encoders_batch_and_match_the_model(platform_server, served_lake, tmp_path):
    import asyncio

    from ml.clip import encode_texts, load_model, tokenizer
    from serving.models.kinds.encoders import clip_spec

    url = platform_server.url
    texts = [f"a small {w} model" for w in ("red", "blue", "green", "low-poly", "game", "chair")]
    registry = ModelRegistry.local(served_lake / "registry")
    folder = registry.load("clip", registry.by_alias("clip", "champion").version, tmp_path / "clip")
    spec = clip_spec(folder)
    expected = encode_texts(load_model(spec), tokenizer(spec)(texts).numpy())

    async def concurrent() -> list[dict]:
        async with httpx.AsyncClient(timeout=60) as client:
            requests = [
                client.post(
                    f"{url}/v2/models/clip_text/infer",
                    json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [t]}]},
                )
                for t in texts
            ]
            return [r.json() for r in await asyncio.gather(*requests)]

    def batch_sizes() -> tuple[str, dict[str, float]]:
        metrics = httpx.get(f"{url}/metrics").text
        return metrics, {
            line.split("{")[0]: float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("mlplane_model_batch_size_") and 'model="clip_text"' in line and "_bucket" not in line
        }

    _, before = batch_sizes()  # the server is the package's: other tests' calls are counted too
    answers = asyncio.run(concurrent())
    vectors = np.array([a["outputs"][0]["data"] for a in answers], np.float32)
    np.testing.assert_allclose(vectors, expected, rtol=1e-4, atol=1e-5)
    metrics, after = batch_sizes()
    added = {name: after[name] - before.get(name, 0.0) for name in after}
    # every row went through the batcher once; calls <= rows (requests arriving together share one)
    assert added["mlplane_model_batch_size_sum"] == len(texts)
    assert 1 <= added["mlplane_model_batch_size_count"] <= len(texts)
    assert 'mlplane_model_request_seconds_bucket{le="0.5",model="clip_text",version="1"}' in metrics

    thumbnail = next((served_lake / "landing").rglob("*.png")).read_bytes()
    image = triton.InferInput("image", [2], "BYTES")
    image.set_data_from_numpy(np.array([thumbnail, thumbnail], dtype=object))
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    embedded = client.infer("clip_image", [image]).as_numpy("embedding")
    assert embedded.shape[0] == 2 and np.allclose(np.linalg.norm(embedded, axis=1), 1.0, atol=1e-4)
    scored = client.infer("content_violation", [image])
    assert scored.as_numpy("similarity").shape == (2,) and scored.as_numpy("flagged").dtype == bool
    corrupt = httpx.post(
        f"{url}/v2/models/clip_image/infer",
        json={
            "inputs": [
                {
                    "name": "image",
                    "datatype": "BYTES",
                    "shape": [1],
                    "data": ["bm90IGFuIGltYWdl"],
                    "parameters": {"binary_encoding": "base64"},
                }
            ]
        },
    )
    assert corrupt.status_code == 400 and "not a readable PNG/JPEG" in corrupt.json()["error"]


def run_skew_check(lake) -> dict:
    result = materialize(
        all_assets,
        selection=AssetSelection.assets(SERVED_FEATURES),
        resources=local_resources(lake),
        instance=DagsterInstance.ephemeral(),
    )
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == SKEW_CHECK
    return {"passed": check.passed, **{k: v.value for k, v in check.metadata.items()}}


def test_served_features_match_offline_point_in_time(platform_server, served_lake):
    import shutil

    url, server = platform_server.url, platform_server.server
    server.feature_log.flush()
    shutil.rmtree(served_lake / "serving" / "served_features", ignore_errors=True)
    # not the user whose streaming row a test above wrote only online (the check would rightly call it skew)
    users = [u for u in range(1, 40) if u not in WRITTEN_ONLY_ONLINE]
    for user_id in random.Random(3).sample(users, 5):
        assert httpx.post(f"{url}/recommend", json={"user_id": user_id, "k": 3}).status_code == 200
    server.feature_log.flush()
    report = run_skew_check(served_lake)
    assert report["rows"] >= 4 and report["features"] > 5
    # a served value that the offline tables never held is skew the check reports by feature
    logged = sorted((served_lake / "serving" / "served_features").rglob("part-*.parquet"))[-1]
    frame = pl.read_parquet(logged)
    assert set(frame["consent"]) == {"mlplane.log_inputs=true"}  # the card's consent, set in served_lake
    features = json.loads(frame["features"][0])
    features["user_engagement__clicks_7d"] = (features.get("user_engagement__clicks_7d") or 0) + 1000
    frame.with_columns(pl.lit(json.dumps(features)).alias("features")).head(1).write_parquet(
        logged.with_name("part-9999999999999999999.parquet")
    )
    tampered = run_skew_check(served_lake)
    assert report["passed"], report
    assert not tampered["passed"] and "user_engagement__clicks_7d" in tampered["mismatches_by_feature"]
