"""Keyword vectors for hybrid search: BM25 term weights of an item's title, description and category,
stored as a Qdrant sparse vector beside the dense CLIP vectors.

Tokens (lowercased, English stop words dropped, stemmed) and their indices come from Qdrant's own BM25
model (`qdrant_edge.Bm25`, configured as a Qdrant server's BM25), run in this process for documents and
queries alike, so the embedded engine and a server hold the same vectors. A document's weights are
BM25's saturated term frequencies; the inverse document frequency is Qdrant's: the collection's sparse
vector has the IDF modifier, computed from the points it holds when a query runs, so it follows the
catalogue as items come and go.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import polars as pl

from engines.retrieval.vector_store import Sparse

KEYWORD_VECTOR = "keywords"
# the title is written twice into the document: a title word weighs more than a description word
TITLE_REPEATS = 2


def item_document(title: str | None, description: str | None, category: str | None) -> str:
    """The text an item's keyword vector is made of."""
    title = (title or "").strip()
    return " ".join(part for part in ([title] * TITLE_REPEATS + [description or "", category or ""]) if part)


def item_documents(items: pl.DataFrame) -> list[str]:
    """`item_document` of each catalogue row (description and category are optional columns)."""

    def column(name: str) -> list:
        return items[name].to_list() if name in items.columns else [None] * items.height

    return [item_document(*row) for row in zip(column("title"), column("description"), column("category"))]


def average_length(documents: Iterable[str]) -> float:
    """Mean distinct tokens per document: BM25's length normalization is relative to it."""
    lengths = [len(_model(1.0).embed_query(d).indices) for d in documents]
    return max(1.0, sum(lengths) / len(lengths)) if lengths else 1.0


def document_vectors(documents: list[str], avg_len: float) -> list[Sparse]:
    """BM25 document weights (no IDF: Qdrant applies it) of each document."""
    model = _model(round(float(avg_len), 2))
    return [_sparse(model.embed_document(d)) for d in documents]


def query_vector(text: str) -> Sparse:
    """The query's distinct tokens, weight 1 each; empty when it holds only stop words or punctuation."""
    return _sparse(_model(1.0).embed_query(text))


@lru_cache(maxsize=8)
def _model(avg_len: float):
    from qdrant_edge import Bm25, Bm25Config

    return Bm25(Bm25Config(avg_len=avg_len, language="english"))


def _sparse(vector) -> Sparse:
    return Sparse(tuple(int(i) for i in vector.indices), tuple(float(v) for v in vector.values))
