"""Hybrid search: BM25 keyword vectors beside dense vectors in one collection, fused by reciprocal rank,
on the embedded engine (Qdrant Edge) and through qdrant-client (its local mode standing in for a server);
then `ItemSearch` over an index written by `sync_vector_store`, with the compact CLIP model's random
weights, so that only the keyword branch can find an item by its title."""

import random
from collections import Counter

import numpy as np
import polars as pl
import pytest

from engines.retrieval.embeddings import COLLECTION, PAYLOAD_INDEXES, needs_keyword_backfill, sync_vector_store
from engines.retrieval.keywords import KEYWORD_VECTOR, average_length, document_vectors, item_documents, query_vector
from engines.retrieval.search import ItemSearch
from engines.retrieval.vector_store import Sparse, VectorStore, _ServerEngine
from ml.clip import COMPACT_MODEL, ClipSpec
from simulator.vocabulary import ADJECTIVES, CATEGORIES, COLOUR_NAMES, MATERIALS

DIM = 8


def titled_catalogue(n: int, seed: int) -> pl.DataFrame:
    """Items titled like the simulator's ("Colour material adjective noun"), every title distinct."""
    rng = random.Random(seed)
    titles: dict[str, tuple[str, float]] = {}
    while len(titles) < n:
        category = rng.choice(CATEGORIES)
        words = (rng.choice(COLOUR_NAMES), rng.choice(MATERIALS), rng.choice(ADJECTIVES), rng.choice(category.nouns))
        titles.setdefault(" ".join(words).capitalize(), (category.name, round(rng.uniform(1, 30), 2)))
    return pl.DataFrame(
        {
            "item_id": list(range(1, n + 1)),
            "title": list(titles),
            "description": [f"A {t.lower()} for your collection." for t in titles],
            "category": [c for c, _ in titles.values()],
            "creator_id": [i % 5 for i in range(n)],
            "price": [p for _, p in titles.values()],
        }
    )


def open_store(engine: str, folder: str) -> VectorStore:
    return VectorStore.open(folder) if engine == "edge" else VectorStore(_ServerEngine(path=folder), folder)


@pytest.fixture(params=["edge", "qdrant-client"])
def store(request, tmp_path):
    items = titled_catalogue(60, seed=1)
    documents = item_documents(items)
    with open_store(request.param, str(tmp_path / "vectors")) as store:
        store.ensure_collection("items", {"image": DIM}, {"category": "keyword", "price": "float"}, sparse=["kw"])
        store.upsert(
            "items",
            [str(i) for i in items["item_id"]],
            {"image": np.random.default_rng(0).normal(size=(items.height, DIM))},
            items.select("item_id", "title", "category", "price").to_dicts(),
            sparse={"kw": document_vectors(documents, average_length(documents))},
        )
        yield store, items


def test_keyword_search_ranks_the_exact_title_first(store):
    store, items = store
    for row in items.head(20).iter_rows(named=True):
        hits = store.search("items", query_vector(row["title"]), using="kw", k=3)
        assert hits[0].payload["item_id"] == row["item_id"], row["title"]
        assert hits[0].score > hits[1].score


def test_a_rare_word_outweighs_a_common_one(store):
    """IDF from the collection: among items matching one word of the query each, the rare word wins."""
    store, items = store
    words = Counter(w for t in items["title"].to_list() for w in t.lower().split() if "-" not in w)
    rare = next(w for w, n in words.items() if n == 1)
    common = words.most_common(1)[0][0]
    hits = store.search("items", query_vector(f"{common} {rare}"), using="kw", k=1)
    assert rare in hits[0].payload["title"].lower()


def test_fusion_keeps_the_keyword_top_and_applies_filters_to_both_branches(store):
    store, items = store
    target = items.row(7, named=True)
    dense = np.random.default_rng(5).normal(size=DIM)  # unrelated to the target
    queries = {"image": dense, "kw": query_vector(target["title"])}
    fused = store.fused_search("items", queries, k=5, weights={"kw": 3.0}, rrf_k=1)
    assert fused[0].payload["item_id"] == target["item_id"]
    dense_top = store.search("items", dense, using="image", k=1)[0]
    assert dense_top.id in {h.id for h in fused}, "the dense branch's best is fused in too"
    other = next(c for c in items["category"].unique().to_list() if c != target["category"])
    filtered = store.fused_search("items", queries, k=10, filters={"category": other, "price": {"lte": 20}})
    assert filtered and target["item_id"] not in {h.payload["item_id"] for h in filtered}
    assert all(h.payload["category"] == other and h.payload["price"] <= 20 for h in filtered)
    expected = items.filter((pl.col("category") == other) & (pl.col("price") <= 20)).height
    assert len(filtered) == min(10, expected)


def test_an_empty_keyword_query_is_refused(store):
    store, _ = store
    assert query_vector("the of and") == Sparse((), ())
    with pytest.raises(ValueError, match="sparse query has no terms"):
        store.search("items", query_vector("the of and"), using="kw", k=3)


def test_an_index_without_keyword_vectors_gets_them_on_the_embedded_engine(tmp_path):
    items = titled_catalogue(30, seed=2)
    embeddings = items.select(
        "item_id",
        image_embedding=pl.Series(np.random.default_rng(1).normal(size=(30, DIM)).tolist(), dtype=pl.List(pl.Float32)),
        text_embedding=pl.Series(np.random.default_rng(2).normal(size=(30, DIM)).tolist(), dtype=pl.List(pl.Float32)),
    )
    with VectorStore.open(str(tmp_path / "vectors")) as store:
        assert not needs_keyword_backfill(store)  # no index yet
        store.ensure_collection(COLLECTION, {"image": DIM, "text": DIM}, PAYLOAD_INDEXES)  # as built before
        assert needs_keyword_backfill(store)
        sync_vector_store(store, embeddings, items)
        assert store.sparse_vectors(COLLECTION) == {KEYWORD_VECTOR} and not needs_keyword_backfill(store)
        hits = store.search(COLLECTION, query_vector(items["title"][4]), using=KEYWORD_VECTOR, k=1)
        assert hits[0].payload["item_id"] == items["item_id"][4]
    with VectorStore.open(str(tmp_path / "vectors")) as store:  # the added vector persists
        assert store.sparse_vectors(COLLECTION) == {KEYWORD_VECTOR}


@pytest.fixture
def item_search(tmp_path):
    items = titled_catalogue(120, seed=3)
    rng = np.random.default_rng(4)
    embeddings = items.select(
        "item_id",
        image_embedding=pl.Series(rng.normal(size=(120, 128)).tolist(), dtype=pl.List(pl.Float32)),
        text_embedding=pl.Series(rng.normal(size=(120, 128)).tolist(), dtype=pl.List(pl.Float32)),
    )
    with VectorStore.open(str(tmp_path / "vectors")) as store:
        sync_vector_store(store, embeddings, items)
        yield ItemSearch(store, ClipSpec(COMPACT_MODEL)), items


def test_item_search_finds_every_item_by_its_title_where_clip_alone_cannot(item_search):
    search, items = item_search
    hybrid = [search.search(text=t, k=1)[0].payload["item_id"] for t in items["title"]]
    dense = [search.search(text=t, k=10, dense_only=True) for t in items["title"]]
    assert hybrid == items["item_id"].to_list()
    found_by_clip = sum(i in {h.payload["item_id"] for h in hits} for i, hits in zip(items["item_id"], dense))
    assert found_by_clip < 0.5 * items.height  # random weights: about 10 of 120 by chance


def test_item_search_filters_hold_and_image_queries_stay_dense(item_search, tmp_path):
    search, items = item_search
    target = items.row(11, named=True)
    hits = search.search(text=target["title"], k=10, category=target["category"], price_max=target["price"])
    assert hits[0].payload["item_id"] == target["item_id"]
    assert all(h.payload["category"] == target["category"] and h.payload["price"] <= target["price"] for h in hits)
    cheaper = search.search(text=target["title"], k=10, price_max=target["price"] - 0.01)
    assert target["item_id"] not in {h.payload["item_id"] for h in cheaper}
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 30, 30)).save(tmp_path / "query.png")
    by_image = search.search(image=tmp_path / "query.png", k=5)
    assert len(by_image) == 5 and all(-1.0 <= h.score <= 1.0 for h in by_image)  # cosine, not a fused score
