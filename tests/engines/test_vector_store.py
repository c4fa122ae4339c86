"""The vector store on its embedded engine (Qdrant Edge, real, in-process) and through qdrant-client
(its local mode stands in for a server here: the same client calls and filter translation)."""

import numpy as np
import pytest

from engines.retrieval.vector_store import VectorStore, _ServerEngine, point_id

DIM = 16


def catalogue(n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = list(range(1, n + 1))
    image = rng.normal(size=(n, DIM)).astype(np.float32)
    text = rng.normal(size=(n, DIM)).astype(np.float32)
    payloads = [
        {
            "item_id": i,
            "category": ["props", "vehicles", "characters"][i % 3],
            "creator": i % 7,
            "price": float(i % 50),
            "flags": ["violation"] if i % 10 == 0 else [],
        }
        for i in ids
    ]
    return ids, image, text, payloads


def open_store(engine: str, folder: str) -> VectorStore:
    if engine == "edge":
        return VectorStore.open(folder)
    return VectorStore(_ServerEngine(path=folder), folder)


@pytest.fixture(params=["edge", "qdrant-client"])
def store(request, tmp_path):
    ids, image, text, payloads = catalogue()
    store = open_store(request.param, str(tmp_path / "vectors"))
    store.ensure_collection(
        "items", {"image": DIM, "text": DIM}, {"category": "keyword", "creator": "integer", "price": "float"}
    )
    store.upsert("items", [str(i) for i in ids], {"image": image, "text": text}, payloads)
    yield store, (ids, image, text, payloads)
    store.close()


def brute_force(matrix: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    m = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    return list(np.argsort(-(m @ (query / np.linalg.norm(query))))[:k])


def test_search_finds_the_exact_nearest_items_with_payload(store):
    store, (ids, image, _, payloads) = store
    query = image[41] + 0.01
    hits = store.search("items", query, using="image", k=5)
    assert [h.id for h in hits] == [str(ids[r]) for r in brute_force(image, query, 5)]
    assert hits[0].id == "42" and hits[0].payload == payloads[41]  # the item id keeps its int type
    assert hits[0].score == pytest.approx(1.0, abs=1e-3)
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_filters_return_only_matching_items(store):
    store, (_, _, text, _) = store
    query = text[0]
    hits = store.search("items", query, "text", 20, filters={"category": "vehicles", "price": {"gte": 10, "lte": 30}})
    assert hits and len(hits) <= 20
    assert all(h.payload["category"] == "vehicles" and 10 <= h.payload["price"] <= 30 for h in hits)
    # exactly the matching items, ranked as brute force ranks them
    ids, _, text_all, payloads = catalogue()
    matching = [r for r, p in enumerate(payloads) if p["category"] == "vehicles" and 10 <= p["price"] <= 30]
    expected = [str(ids[matching[r]]) for r in brute_force(text_all[matching], query, 20)]
    assert [h.id for h in hits] == expected

    excluded = [h.id for h in hits[:3]]
    again = store.search("items", query, "text", 5, filters={"category": "vehicles", "id": {"not_in": excluded}})
    assert not set(excluded) & {h.id for h in again}
    assert all(h.payload["category"] == "vehicles" for h in again)
    any_of = store.search("items", query, "text", 50, filters={"creator": [1, 2]})
    assert any_of and {h.payload["creator"] for h in any_of} <= {1, 2}


def test_upsert_is_idempotent_and_delete_removes(store):
    store, (ids, image, text, payloads) = store
    assert store.count("items") == len(ids)
    store.upsert(
        "items",
        [str(i) for i in ids[:50]],
        {"image": image[:50], "text": text[:50]},
        [{**p, "price": 999.0} for p in payloads[:50]],
    )
    assert store.count("items") == len(ids)
    hit = store.search("items", image[0], "image", 1)[0]
    assert hit.id == "1" and hit.payload["price"] == 999.0
    store.delete("items", ["1", "2", "3"])
    assert store.count("items") == len(ids) - 3
    assert "1" not in {h.id for h in store.search("items", image[0], "image", 10)}
    assert sorted(store.ids("items"), key=int) == [str(i) for i in ids[3:]]


def test_collection_persists_across_reopen(request, store):
    store, (ids, image, _, _) = store
    location = store.location
    store.close()
    reopened = open_store(request.node.callspec.params["store"], location)
    try:
        reopened.ensure_collection("items", {"image": DIM, "text": DIM}, {"category": "keyword"})
        assert reopened.count("items") == len(ids)
        assert reopened.search("items", image[9], "image", 1)[0].id == "10"
        with pytest.raises(ValueError, match="exists with vectors"):
            reopened.ensure_collection("items", {"image": 8})
    finally:
        reopened.close()


def test_bad_input_gets_a_clear_error(store, tmp_path):
    store, _ = store
    with pytest.raises(ValueError, match="shape"):
        store.upsert("items", ["a", "b"], {"image": np.zeros((3, DIM))}, [{}, {}])
    with pytest.raises(ValueError, match="duplicate ids"):
        store.upsert("items", ["a", "a"], {"image": np.zeros((2, DIM))}, [{}, {}])
    with pytest.raises(ValueError, match="range keys"):
        store.search("items", np.ones(DIM), "image", 3, filters={"price": {"between": 3}})
    with pytest.raises(ValueError, match="only local folders"):
        VectorStore.open("s3://bucket/vectors")


def test_missing_collection_is_named(tmp_path):
    with VectorStore.open(str(tmp_path)) as store, pytest.raises(KeyError, match="'missing' does not exist"):
        store.search("missing", np.ones(DIM), "image", 3)


def test_point_ids_are_deterministic_uuids():
    assert point_id("42") == point_id(42) != point_id("43")
    assert len(point_id("42")) == 36
