"""Feast's feature-server API on the model server: the same request answered by `feast serve` (started
once on the same repository and online store) and by the model server gives the same JSON, on random
entities (present, missing, mixed, repeated), feature services and feature lists, short and full
names; the model server answers through its own read path, not Feast's SDK, and from many threads."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import polars as pl
import pytest

from engines.features.feast_internals import online_store
from serving.models.protocols import feast_api
from tests.serving.models.conftest import free_port

SEED = int(os.environ.get("MLPLANE_TEST_SEED", "12"))
MISSING = 10**9  # ids from here on are in no table


@pytest.fixture(scope="module")
def feast_serve(platform_server):
    repo = platform_server.server.feature_store.write_repo().parent
    port = free_port()
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("feast")),
            "-c",
            str(repo),
            "serve",
            "-p",
            str(port),
            "--no-access-log",
            "-w",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "FEAST_USAGE": "False"},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        assert process.poll() is None and time.time() < deadline, "feast serve did not start"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.5)
    yield url
    os.killpg(process.pid, 15)
    process.wait(60)


def by_feature(answer: dict) -> dict:
    """Feature name -> its result. The order of a view's features in Feast's answer differed between
    `feast serve` and this process reading the same registry (seen here), so names are matched."""
    names = answer["metadata"]["feature_names"]
    assert len(names) == len(answer["results"])
    return dict(zip(names, answer["results"]))


def test_get_online_features_answers_as_feast_serve_does(platform_server, feast_serve):
    requests = [
        {
            "feature_service": "personalization_ranking",
            "full_feature_names": True,
            "entities": {"user_id": [1, 2, 3, 999999], "item_id": [5, 6, 7, 8]},
        },
        {
            "features": ["user_engagement:clicks_7d", "user_profile:region", "user_activity_realtime:plays_1h"],
            "entities": {"user_id": [4, 5]},
        },
        {"feature_service": "search", "entities": {"item_id": [1, 2, 3]}},
    ]
    for body in requests:
        theirs = httpx.post(f"{feast_serve}/get-online-features", json=body, timeout=30)
        ours = httpx.post(f"{platform_server.url}/get-online-features", json=body, timeout=30)
        assert theirs.status_code == ours.status_code == 200, (theirs.text, ours.text)
        assert set(ours.json()) == set(theirs.json()) == {"metadata", "results"}
        assert by_feature(ours.json()) == by_feature(theirs.json())
    assert any(s == "PRESENT" for r in ours.json()["results"] for s in r["statuses"])


def test_get_online_features_rejects_bad_requests_with_4xx(platform_server):
    url = f"{platform_server.url}/get-online-features"
    cases = [
        ({"feature_service": "nope", "entities": {"user_id": [1]}}, 404, "unknown feature service 'nope'"),
        ({"entities": {"user_id": [1]}}, 400, "give a feature_service"),
        ({"feature_service": "search", "entities": {"item_id": [1, 2], "user_id": [1]}}, 400, "differ in length"),
        ({"feature_service": "search", "entities": {}}, 400, "entities: Dictionary should have at least 1 item"),
        ({"feature_service": "search", "entities": {"item_id": [1.5]}}, 400, "integers or strings"),
        ({"feature_service": "search"}, 400, "entities"),
        ({"features": ["no_such_view:x"], "entities": {"user_id": [1]}}, 400, "no_such_view does not exist"),
        ({"features": ["user_profile:nope"], "entities": {"user_id": [1]}}, 400, "nope"),
        ({"features": ["user_profile"], "entities": {"user_id": [1]}}, 400, "user_profile"),
        # two views' impressions_7d under one short name, as Feast refuses it
        ({"feature_service": "personalization_ranking", "entities": {"user_id": [1]}}, 400, "FeatureNameCollision"),
        # the item views of the service have no join key given (Feast's KeyError, through its SDK)
        ({"feature_service": "search", "entities": {"user_id": [1]}}, 400, "Missing join key"),
    ]
    for body, status, message in cases:
        response = httpx.post(url, json=body, timeout=30)
        assert response.status_code == status and message in response.json()["error"], (body, response.text)


@pytest.fixture(scope="module")
def lake_ids(platform_server) -> dict:
    """Ids the lake's online views hold: (user, item) pairs with affinity rows, users, items."""
    offline = platform_server.server.config.lake_path() / "offline"
    pairs = pl.read_parquet(offline / "user_item_affinity" / "*" / "*.parquet").select("user_id", "item_id")
    return {
        "pairs": sorted(set(pairs.rows())),
        "users": sorted(set(pl.read_parquet(offline / "user_profile" / "*" / "*.parquet")["user_id"])),
        "items": sorted(set(pl.read_parquet(offline / "item_content" / "*" / "*.parquet")["item_id"])),
    }


@pytest.fixture
def sdk_calls(monkeypatch) -> list:
    """Requests the model server handed to Feast's SDK instead of its own read path."""
    calls = []
    original = feast_api.FeastFeatures.sdk_answer

    def recorded(self, plan, body):
        calls.append(body)
        return original(self, plan, body)

    monkeypatch.setattr(feast_api.FeastFeatures, "sdk_answer", recorded)
    return calls


def random_requests(ids: dict, store, rng: random.Random) -> list[dict]:
    """Feature services and random feature lists over present, missing, mixed and repeated entities."""
    pairs, users, items = ids["pairs"], ids["users"], ids["items"]
    present = rng.sample(pairs, 6)
    missing = [(MISSING + rng.randrange(10**6), MISSING + rng.randrange(10**6)) for _ in range(3)]
    half = [(u, MISSING + i) for u, i in rng.sample(pairs, 2)]  # a user that exists with an unknown item
    mixed = present[:3] + missing[:2] + half + [present[0]]  # the first pair again
    rng.shuffle(mixed)
    refs = [f"{v.name}:{f.name}" for v in store.list_feature_views() for f in v.features]
    by_short: dict = {}
    for ref in rng.sample(refs, len(refs)):
        by_short.setdefault(ref.split(":")[1], ref)  # one reference per short name: no collision
    requests = []
    for rows in (present, missing, mixed):
        columns = {"user_id": [u for u, _ in rows], "item_id": [i for _, i in rows]}
        requests.append({"feature_service": "personalization_ranking", "full_feature_names": True, "entities": columns})
        requests.append({"features": rng.sample(refs, 9), "full_feature_names": True, "entities": columns})
        requests.append({"features": rng.sample(sorted(by_short.values()), 7), "entities": columns})
    item_rows = rng.sample(items, 3) + [MISSING + 1] + rng.sample(items, 1)
    requests += [
        {"feature_service": "search", "entities": {"item_id": item_rows}},
        {"feature_service": "search", "full_feature_names": True, "entities": {"item_id": item_rows[:2]}},
        # another entity's join key is echoed back, a column that is no join key is not
        {"feature_service": "search", "entities": {"user_id": rng.sample(users, 2), "item_id": item_rows[:2]}},
        {"feature_service": "search", "entities": {"session": ["a", "b"], "item_id": item_rows[:2]}},
        {
            "feature_service": "safety",  # its user and item views share feature names: full names only
            "full_feature_names": True,
            "entities": {"item_id": item_rows[:3], "user_id": rng.sample(users, 3)},
        },
        {"features": ["user_profile:region", "user_engagement:clicks_7d"], "entities": {"user_id": [users[0]] * 3}},
    ]
    return requests


def assert_same_answer(ours: httpx.Response, theirs: httpx.Response, body: dict) -> None:
    """Equal JSON: the same keys, the same columns in the same order (a view's features come in an order
    that varies between processes, Feast's own included), each feature's whole result equal."""
    assert ours.status_code == theirs.status_code == 200, (body, ours.text[:300], theirs.text[:300])
    a, b = ours.json(), theirs.json()
    assert list(a) == list(b) == ["results", "metadata"], body
    names_a, names_b = a["metadata"]["feature_names"], b["metadata"]["feature_names"]
    assert sorted(names_a) == sorted(names_b), body
    keys = [k for k in body["entities"] if k in ("user_id", "item_id")]
    assert names_a[: len(keys)] == names_b[: len(keys)] == keys, body
    if body.get("full_feature_names"):
        views = [[n.split("__")[0] for n in names] for names in (names_a, names_b)]
        assert list(dict.fromkeys(views[0])) == list(dict.fromkeys(views[1])), body
    assert by_feature(a) == by_feature(b), body


def test_fast_path_answers_as_feast_serve_on_random_entities(platform_server, feast_serve, lake_ids, sdk_calls):
    from feast.feature_server_utils import convert_response_to_dict

    store = platform_server.server.feature_store.store
    rng = random.Random(SEED)
    statuses: set = set()
    for body in random_requests(lake_ids, store, rng):
        ours = httpx.post(f"{platform_server.url}/get-online-features", json=body, timeout=30)
        theirs = httpx.post(f"{feast_serve}/get-online-features", json=body, timeout=30)
        assert_same_answer(ours, theirs, {**body, "seed": SEED})
        # Feast's SDK in this process orders a view's features as this process does: the whole JSON is equal
        sdk = store.get_online_features(
            features=store.get_feature_service(body["feature_service"])
            if "feature_service" in body
            else body["features"],
            entity_rows=body["entities"],
            full_feature_names=body.get("full_feature_names", False),
        )
        assert ours.json() == convert_response_to_dict(sdk.proto), body
        statuses |= {s for r in ours.json()["results"] for s in r["statuses"]}
    assert sdk_calls == []  # every one answered by the fast path
    assert statuses == {"PRESENT", "NOT_FOUND"}


def test_values_older_than_the_views_ttl_are_present_as_feast_serves_them(platform_server, feast_serve, lake_ids):
    """Feast 0.67's online read applies no TTL: user_engagement (a daily view, TTL one day) holds rows of
    the lake's January days, and `feast serve` answers them PRESENT; so does the model server."""
    ttl = platform_server.server.feature_store.store.get_feature_view("user_engagement").ttl
    assert ttl == timedelta(days=1)
    body = {"features": ["user_engagement:clicks_7d"], "entities": {"user_id": lake_ids["users"][:5]}}
    ours = httpx.post(f"{platform_server.url}/get-online-features", json=body, timeout=30)
    theirs = httpx.post(f"{feast_serve}/get-online-features", json=body, timeout=30)
    assert ours.json() == theirs.json()
    result = by_feature(ours.json())["clicks_7d"]
    stamps = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in result["event_timestamps"]]
    stale = [s for s, status in zip(stamps, result["statuses"]) if status == "PRESENT" and s < datetime.now(UTC) - ttl]
    assert stale, result


def test_sdk_answers_what_the_fast_path_cannot_as_feast_serve_does(platform_server, feast_serve, lake_ids, sdk_calls):
    user = lake_ids["users"][0]
    cases = [
        {"features": ["user_profile:region"], "entities": {"user_id": [str(user), str(user + 1)]}},  # Feast coerces
        {"features": ["user_profile:region"], "entities": {"user": [user]}},  # an entity's name, not its join key
        {
            "features": ["user_profile:region"],
            "include_feature_view_version_metadata": True,
            "entities": {"user_id": [user]},
        },
    ]
    for body in cases:
        ours = httpx.post(f"{platform_server.url}/get-online-features", json=body, timeout=30)
        theirs = httpx.post(f"{feast_serve}/get-online-features", json=body, timeout=30)
        assert ours.status_code == theirs.status_code == 200, (body, ours.text, theirs.text)
        assert by_feature(ours.json()) == by_feature(theirs.json()), body
        assert ours.json().get("metadata") == theirs.json().get("metadata"), body
    assert len(sdk_calls) == len(cases)


def test_fast_path_answers_32_connections_at_once(platform_server, lake_ids, sdk_calls):
    rng = random.Random(SEED + 1)
    bodies = [
        {
            "feature_service": "personalization_ranking",
            "full_feature_names": True,
            "entities": {"user_id": [u for u, _ in rows], "item_id": [i for _, i in rows]},
        }
        for rows in (rng.sample(lake_ids["pairs"], rng.choice([1, 5, 20])) for _ in range(8))
    ]
    url = f"{platform_server.url}/get-online-features"
    expected = [httpx.post(url, json=b, timeout=30).json() for b in bodies]
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda i: (i % 8, client.post(url, json=bodies[i % 8])), range(320)))
    assert all(r.status_code == 200 for _, r in answers), {r.status_code for _, r in answers}
    assert all(r.json() == expected[i] for i, r in answers)
    assert sdk_calls == []


def test_plans_are_resolved_again_when_the_registry_changes(platform_server):
    features = platform_server.uvicorn.config.app.state.feast_features
    body = {"feature_service": "search", "entities": {"item_id": [1]}}
    url = f"{platform_server.url}/get-online-features"
    assert httpx.post(url, json=body, timeout=30).status_code == 200
    plan = features.plans[("search", (), False)]
    assert httpx.post(url, json=body, timeout=30).status_code == 200
    assert features.plans[("search", (), False)] is plan  # cached
    platform_server.server.feature_store.store.refresh_registry()  # what a registry change does to the cache
    features.checked_at = float("-inf")  # due for its check now rather than within REGISTRY_CHECK_S
    assert httpx.post(url, json=body, timeout=30).status_code == 200
    assert features.plans[("search", (), False)] is not plan


def test_entity_keys_are_serialized_as_feast_serializes_them():
    from feast import ValueType
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    from engines.features.entity_keys import key_serializer

    def proto(value, kind):
        return Value(int64_val=value) if kind == ValueType.INT64 else Value(string_val=value)

    cases = [
        ([("user_id", ValueType.INT64)], (7,)),
        ([("user_id", ValueType.INT64)], (-(2**63),)),
        ([("sku", ValueType.STRING)], ("été-42",)),
        ([("user_id", ValueType.INT64), ("item_id", ValueType.INT64)], (3, 2**40)),
        ([("zone", ValueType.STRING), ("a_id", ValueType.INT64)], ("eu", 5)),
    ]
    for keys, values in cases:
        expected = serialize_entity_key(
            EntityKey(join_keys=[k for k, _ in keys], entity_values=[proto(v, t) for v, (_, t) in zip(values, keys)]),
            entity_key_serialization_version=3,
        )
        assert key_serializer(tuple(keys))(values) == expected, (keys, values)


def test_read_path_returns_what_feasts_online_read_returns(platform_server, lake_ids):
    """mlplane's SQLite read (its own query, lazy parsing, one timestamp per entity) against Feast's
    SqliteOnlineStore.online_read on the same store, view by view, present and missing entities."""
    from feast.infra.online_stores.sqlite import SqliteOnlineStore

    from engines.features.feature_store import OnlineReader

    store = platform_server.server.feature_store.store
    reader = OnlineReader(store, "personalization_ranking")
    assert type(reader.online_store) is SqliteOnlineStore
    rng = random.Random(SEED + 2)
    rows = rng.sample(lake_ids["pairs"], 20) + [(MISSING, MISSING), (lake_ids["users"][0], MISSING)]
    columns = {"user_id": [u for u, _ in rows], "item_id": [i for _, i in rows]}
    for view, features, keys in reader.plan:
        key_of, found = reader.read_view(view, features, keys, columns)
        names = [k for k, _ in keys]
        theirs = online_store(store).online_read(
            config=store.config,
            table=view,
            entity_keys=[reader_key(names, key) for key in found],
            requested_features=features,
        )
        for (ts, values), (their_ts, their_values) in zip(found.values(), theirs):
            assert ts == their_ts, view.name
            if their_values is None:
                assert values is None, view.name
            else:
                assert values == {f: v for f, v in their_values.items() if f in features}, view.name
        assert len(key_of) == len(rows) and any(v is None for _, v in found.values())


def reader_key(names: list[str], values: tuple):
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    return EntityKey(join_keys=names, entity_values=[Value(int64_val=v) for v in values])
