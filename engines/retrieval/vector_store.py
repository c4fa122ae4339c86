"""The vector database: named-vector collections with payload filters, over Qdrant.

`VectorStore.open(location)` picks the engine from the location:
- a local folder: Qdrant Edge (`qdrant-edge-py`), the Qdrant engine embedded in this process, one
  shard folder per collection, HNSW-indexed once a segment outgrows the indexing threshold. It was
  chosen over qdrant-client's local mode (pure-Python brute force) on measured recall and latency
  (`benchmarks/embeddings.py`). Like local mode, a folder is open in one process at a time.
- an `http(s)://` URL: a Qdrant server or cluster through qdrant-client.

Points are keyed by the caller's string id: the point id is `uuid5(NAMESPACE, id)`, so upserting
the same ids again replaces the same points (idempotent). Cosine distance throughout.

Filters (`search(..., filters=...)`): `{"field": value}` equality (a list matches any of its values),
`{"field": {"gte": 1, "lte": 5}}` ranges (gt/gte/lt/lte), `{"id": {"not_in": [...]}}` excludes ids.

Sparse vectors (`ensure_collection(..., sparse=[name])`, `Sparse(indices, values)`) sit beside the dense
ones with Qdrant's IDF modifier (dot product, each term weighted by its inverse document frequency in the
collection). `fused_search` runs one prefetch per named vector, each with the filters, and fuses them by
reciprocal rank (Qdrant's RRF query, weights per vector).
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ID_NAMESPACE = uuid.UUID("5b3c1f0e-8a52-4d0a-9a53-6c1f3b7d2e41")
ID_KEY = "_id"  # payload key holding the caller's string id (uuid5 cannot be reversed)
PAYLOAD_INDEX_TYPES = ("keyword", "integer", "float", "bool")
RANGE_KEYS = ("gt", "gte", "lt", "lte")
UPSERT_BATCH = 512
RRF_K = 2  # Qdrant's default


def point_id(item_id: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, str(item_id)))


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    payload: dict


@dataclass(frozen=True)
class Sparse:
    """A sparse vector: term indices and their weights."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.indices) != len(self.values):
            raise ValueError(f"sparse vector: {len(self.indices)} indices but {len(self.values)} values")


class VectorStore:
    """One vector database: collections of points with named vectors and a payload."""

    def __init__(self, engine: _Engine, location: str):
        self._engine = engine
        self.location = location

    @classmethod
    def open(cls, location: str) -> VectorStore:
        """A local folder (embedded engine, created if missing) or an http(s):// Qdrant server URL."""
        if not location:
            raise ValueError("vector store location is empty: give a folder or an http(s):// Qdrant URL")
        if location.startswith(("http://", "https://")):
            return cls(_ServerEngine(location), location)
        if "://" in location:
            raise ValueError(f"vector store location {location!r}: only local folders and http(s):// URLs")
        return cls(_EdgeEngine(Path(location)), location)

    def ensure_collection(
        self,
        name: str,
        vectors: dict[str, int],
        payload_indexes: dict[str, str] | None = None,
        sparse: Sequence[str] = (),
    ) -> None:
        """Create the collection if missing (named vectors -> dimension, `sparse` vector names), and its
        payload indexes. An existing collection with other dense vectors is an error, not silently
        recreated; a sparse vector it lacks is added by the embedded engine (its points get values when
        next upserted), while a Qdrant server cannot add one (an error says to index again)."""
        if not vectors:
            raise ValueError(f"collection {name!r} needs at least one named vector")
        for field, kind in (payload_indexes or {}).items():
            if kind not in PAYLOAD_INDEX_TYPES:
                raise ValueError(f"payload index {field!r}: type {kind!r} is not one of {PAYLOAD_INDEX_TYPES}")
        if set(sparse) & set(vectors):
            raise ValueError(f"collection {name!r}: {sorted(set(sparse) & set(vectors))} both dense and sparse")
        self._engine.ensure_collection(
            name, {k: int(v) for k, v in vectors.items()}, payload_indexes or {}, sorted(set(sparse))
        )

    def sparse_vectors(self, name: str) -> set[str]:
        """The collection's sparse vector names (empty when it does not exist)."""
        return self._engine.sparse_vectors(name)

    def upsert(
        self,
        name: str,
        ids: Sequence[str],
        vectors: dict[str, np.ndarray],
        payloads: Sequence[dict],
        sparse: dict[str, Sequence[Sparse]] | None = None,
    ) -> None:
        ids = [str(i) for i in ids]
        if len(set(ids)) != len(ids):
            raise ValueError(f"upsert into {name!r}: duplicate ids")
        if len(payloads) != len(ids):
            raise ValueError(f"upsert into {name!r}: {len(ids)} ids but {len(payloads)} payloads")
        arrays = {}
        for vector_name, array in vectors.items():
            array = np.asarray(array, dtype=np.float32)
            if array.ndim != 2 or array.shape[0] != len(ids):
                raise ValueError(
                    f"upsert into {name!r}: vector {vector_name!r} has shape {array.shape}, expected ({len(ids)}, dim)"
                )
            arrays[vector_name] = array
        sparse = sparse or {}
        for vector_name, rows in sparse.items():
            if len(rows) != len(ids):
                raise ValueError(f"upsert into {name!r}: sparse {vector_name!r} has {len(rows)} rows, {len(ids)} ids")
        for start in range(0, len(ids), UPSERT_BATCH):
            end = min(start + UPSERT_BATCH, len(ids))
            self._engine.upsert(
                name,
                [point_id(i) for i in ids[start:end]],
                [
                    {**{n: a[row].tolist() for n, a in arrays.items()}, **{n: s[row] for n, s in sparse.items()}}
                    for row in range(start, end)
                ],
                [{**p, ID_KEY: i} for p, i in zip(payloads[start:end], ids[start:end])],
            )

    def delete(self, name: str, ids: Sequence[str]) -> None:
        if len(ids):
            self._engine.delete(name, [point_id(i) for i in ids])

    def search(
        self, name: str, query: np.ndarray | Sparse, using: str, k: int, filters: dict | None = None
    ) -> list[Hit]:
        """The k nearest points to one dense or sparse query vector on the named vector `using`."""
        query = _query(name, query)
        if k <= 0:
            return []
        points = self._engine.search(name, query, using, k, _parse_filters(filters or {}))
        return [Hit(id=payload.pop(ID_KEY), score=float(score), payload=payload) for score, payload in points]

    def fused_search(
        self,
        name: str,
        queries: dict[str, np.ndarray | Sparse],
        k: int,
        filters: dict | None = None,
        candidates: int | None = None,
        weights: dict[str, float] | None = None,
        rrf_k: int = RRF_K,
    ) -> list[Hit]:
        """Top k by reciprocal rank fusion of one search per named vector (`queries`: vector name ->
        query), each over `candidates` points (default 4 k) passing the filters. Qdrant's RRF: a point
        at 0-based position p of a list with weight w scores 1 / ((p + 1) / w + rrf_k - 1) there, summed
        over the lists. The score is the fused one (higher is better)."""
        if not queries:
            raise ValueError(f"fused search {name!r}: no queries")
        if k <= 0:
            return []
        parsed = {using: _query(name, q) for using, q in queries.items()}
        weights = weights or {}
        points = self._engine.fused_search(
            name,
            parsed,
            [float(weights.get(using, 1.0)) for using in parsed],
            k,
            max(k, candidates or 4 * k),
            _parse_filters(filters or {}),
            rrf_k,
        )
        return [Hit(id=payload.pop(ID_KEY), score=float(score), payload=payload) for score, payload in points]

    def search_batch(self, name: str, queries: np.ndarray, using: str, k: int) -> list[list[Hit]]:
        """`search` for each row of `queries` (n, dim), run by the engine as one batch."""
        queries = np.asarray(queries, dtype=np.float32)
        if queries.ndim != 2:
            raise ValueError(f"search {name!r}: queries must be a (n, dim) array, got shape {queries.shape}")
        if k <= 0 or not len(queries):
            return [[] for _ in range(len(queries))]
        results = self._engine.search_batch(name, queries.tolist(), using, k)
        return [
            [Hit(id=payload.pop(ID_KEY), score=float(score), payload=payload) for score, payload in points]
            for points in results
        ]

    def replica(self, name: str) -> Replica:
        """What another process (a Ray worker on any node) needs to query collection `name`: the
        server's URL, or for the embedded engine a copy of its points to load into a private,
        read-only folder there (one folder is one process's)."""
        if isinstance(self._engine, _ServerEngine) and self.location.startswith(("http://", "https://")):
            return Replica(name, url=self.location)
        return Replica(name, points=self._engine.export(name))

    def ids(self, name: str) -> list[str]:
        """Every id in the collection (to find the ones to delete)."""
        return [p[ID_KEY] for p in self._engine.payloads(name, [ID_KEY])]

    def payload_field(self, name: str, field: str) -> dict[str, object]:
        """Each point's id -> its payload's `field` (None where the point has none)."""
        return {str(v[ID_KEY]): v.get(field) for v in self._engine.payloads(name, [ID_KEY, field])}

    def count(self, name: str) -> int:
        return self._engine.count(name)

    def exists(self, name: str) -> bool:
        return self._engine.exists(name)

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class _Points:
    point_ids: list[str]
    vectors: dict[str, np.ndarray]  # name -> (n, dim) float32: compact in the object store
    payloads: list[dict]


@dataclass(frozen=True)
class Replica:
    """A collection to query from another process: by server URL, or points to copy locally."""

    name: str
    url: str | None = None
    points: _Points | None = None

    def open(self, folder: str) -> VectorStore:
        """The store to search: the server, or the points loaded into `folder` (an empty folder)."""
        if self.url:
            return VectorStore.open(self.url)
        store = VectorStore.open(folder)
        points = self.points
        dims = {n: int(v.shape[1]) for n, v in points.vectors.items()}
        store._engine.ensure_collection(self.name, dims, {}, [])  # dense only: what other processes query
        for start in range(0, len(points.point_ids), UPSERT_BATCH):
            end = start + UPSERT_BATCH
            vectors = [
                {n: v[row].tolist() for n, v in points.vectors.items()}
                for row in range(start, min(end, len(points.point_ids)))
            ]
            store._engine.upsert(self.name, points.point_ids[start:end], vectors, points.payloads[start:end])
        return store


def _query(name: str, query: np.ndarray | Sparse) -> list[float] | Sparse:
    """A query as the engines take it: a dense vector as a list, a sparse one as is."""
    if isinstance(query, Sparse):
        if not query.indices:
            raise ValueError(f"search {name!r}: the sparse query has no terms")
        return query
    query = np.asarray(query, dtype=np.float32)
    if query.ndim != 1:
        raise ValueError(f"search {name!r}: query must be one vector, got shape {query.shape}")
    return query.tolist()


def _points(ids: list[str], vectors: list[dict], payloads: list[dict], dims: dict[str, int]) -> _Points:
    return _Points(
        ids,
        {n: np.asarray([v[n] for v in vectors], np.float32).reshape(len(ids), d) for n, d in dims.items()},
        payloads,
    )


@dataclass(frozen=True)
class _Conditions:
    """Filters parsed once, translated by each engine."""

    equals: dict  # field -> value or list of values
    ranges: dict  # field -> {gte: .., lte: ..}
    exclude_ids: list  # point ids


def _parse_filters(filters: dict) -> _Conditions:
    equals, ranges, exclude = {}, {}, []
    for field, condition in filters.items():
        if field == "id":
            if not (isinstance(condition, dict) and set(condition) == {"not_in"}):
                raise ValueError(f"filter on 'id' must be {{'not_in': [...]}}, got {condition!r}")
            exclude = [point_id(i) for i in condition["not_in"]]
        elif isinstance(condition, dict):
            unknown = set(condition) - set(RANGE_KEYS)
            if unknown or not condition:
                raise ValueError(f"filter on {field!r}: range keys must be among {RANGE_KEYS}, got {condition!r}")
            ranges[field] = {k: float(v) for k, v in condition.items() if v is not None}
        elif isinstance(condition, list | tuple | set):
            equals[field] = list(condition)
        elif isinstance(condition, str | int | bool):
            equals[field] = condition
        else:
            raise ValueError(
                f"filter on {field!r}: unsupported value {condition!r} (use str/int/bool, a list, or a range dict)"
            )
    return _Conditions(equals, ranges, exclude)


class _Engine:
    def ensure_collection(
        self, name: str, vectors: dict[str, int], payload_indexes: dict[str, str], sparse: list[str]
    ) -> None: ...
    def sparse_vectors(self, name: str) -> set[str]: ...
    def upsert(self, name: str, point_ids: list[str], vectors: list[dict], payloads: list[dict]) -> None: ...
    def delete(self, name: str, point_ids: list[str]) -> None: ...
    def search(
        self, name: str, query: list[float] | Sparse, using: str, k: int, conditions: _Conditions
    ) -> list[tuple[float, dict]]: ...
    def fused_search(
        self,
        name: str,
        queries: dict[str, list[float] | Sparse],
        weights: list[float],
        k: int,
        candidates: int,
        conditions: _Conditions,
        rrf_k: int,
    ) -> list[tuple[float, dict]]: ...
    def search_batch(
        self, name: str, queries: list[list[float]], using: str, k: int
    ) -> list[list[tuple[float, dict]]]: ...
    def export(self, name: str) -> _Points: ...
    def payloads(self, name: str, fields: list[str]) -> list[dict]: ...
    def count(self, name: str) -> int: ...
    def exists(self, name: str) -> bool: ...
    def close(self) -> None: ...


class _EdgeEngine(_Engine):
    """Qdrant Edge: one shard folder per collection under the store's folder."""

    def __init__(self, root: Path):
        import qdrant_edge

        self._q = qdrant_edge
        self._root = root
        self._root.mkdir(parents=True, exist_ok=True)
        self._shards: dict = {}
        self._dirty: set[str] = set()  # collections written since their last optimize

    def _shard(self, name: str):
        if name not in self._shards:
            folder = self._root / name
            if not (folder / "edge_config.json").exists():
                raise KeyError(f"collection {name!r} does not exist in {self._root}")
            self._shards[name] = self._q.EdgeShard.load(str(folder))
        return self._shards[name]

    def _config(self, name) -> dict:
        return json.loads((self._root / name / "edge_config.json").read_text())

    def ensure_collection(self, name, vectors, payload_indexes, sparse):
        q = self._q
        folder = self._root / name
        if (folder / "edge_config.json").exists():
            shard = self._shard(name)
            existing = self._dims(name)
            if existing != vectors:
                raise ValueError(f"collection {name!r} exists with vectors {existing}, not {vectors}")
            for vector_name in sorted(set(sparse) - self.sparse_vectors(name)):
                shard.update(q.UpdateOperation.create_sparse_vector(vector_name, modifier=q.Modifier.Idf))
        else:
            if folder.exists():
                shutil.rmtree(folder)  # a create that failed half-way
            config = q.EdgeConfig(
                vectors={n: q.EdgeVectorParams(size=d, distance=q.Distance.Cosine) for n, d in vectors.items()},
                sparse_vectors={n: q.EdgeSparseVectorParams(modifier=q.Modifier.Idf) for n in sparse} or None,
            )
            self._shards[name] = shard = q.EdgeShard.create(str(folder), config)
        indexed = shard.info().payload_schema
        kinds = {
            "keyword": q.PayloadSchemaType.Keyword,
            "integer": q.PayloadSchemaType.Integer,
            "float": q.PayloadSchemaType.Float,
            "bool": q.PayloadSchemaType.Bool,
        }
        for field, kind in payload_indexes.items():
            if field not in indexed:
                shard.update(q.UpdateOperation.create_field_index(field, kinds[kind]))
        shard.flush()

    def sparse_vectors(self, name):
        if not self.exists(name):
            return set()
        return set(self._config(name).get("sparse_vectors", {}))

    def upsert(self, name, point_ids, vectors, payloads):
        q = self._q
        shard = self._shard(name)
        shard.update(
            q.UpdateOperation.upsert_points(
                [q.Point(pid, self._vector(vec), payload) for pid, vec, payload in zip(point_ids, vectors, payloads)]
            )
        )
        self._dirty.add(name)

    def delete(self, name, point_ids):
        self._shard(name).update(self._q.UpdateOperation.delete_points(point_ids))
        self._dirty.add(name)

    def _filter(self, conditions: _Conditions):
        q = self._q
        must = []
        for field, value in conditions.equals.items():
            match = q.MatchAny(value) if isinstance(value, list) else q.MatchValue(value)
            must.append(q.FieldCondition(field, match=match))
        for field, bounds in conditions.ranges.items():
            must.append(q.FieldCondition(field, range=q.RangeFloat(**bounds)))
        must_not = [q.HasIdCondition(set(conditions.exclude_ids))] if conditions.exclude_ids else None
        return q.Filter(must=must or None, must_not=must_not) if must or must_not else None

    def _prepare(self, name):
        """Flush writes and build the HNSW index of segments that outgrew the indexing threshold."""
        shard = self._shard(name)
        if name in self._dirty:
            shard.flush()
            shard.optimize()
            self._dirty.discard(name)
        return shard

    def _vector(self, vector):
        """A named vector (or a point's dict of them) as Qdrant Edge takes it."""
        if isinstance(vector, dict):
            return {n: self._vector(v) for n, v in vector.items()}
        return self._q.SparseVector(list(vector.indices), list(vector.values)) if isinstance(vector, Sparse) else vector

    def search(self, name, query, using, k, conditions):
        q = self._q
        shard = self._prepare(name)
        points = shard.query(
            q.QueryRequest(
                limit=k,
                query=q.Query.Nearest(self._vector(query), using=using),
                filter=self._filter(conditions),
                with_payload=True,
            )
        )
        return [(p.score, dict(p.payload)) for p in points]

    def fused_search(self, name, queries, weights, k, candidates, conditions, rrf_k):
        q = self._q
        shard = self._prepare(name)
        prefetches = [
            q.Prefetch(
                limit=candidates,
                query=q.Query.Nearest(self._vector(query), using=using),
                filter=self._filter(conditions),
            )
            for using, query in queries.items()
        ]
        points = shard.query(
            q.QueryRequest(
                limit=k, prefetches=prefetches, query=q.Fusion.Rrf(k=rrf_k, weights=weights), with_payload=True
            )
        )
        return [(p.score, dict(p.payload)) for p in points]

    def search_batch(self, name, queries, using, k):
        q = self._q
        shard = self._prepare(name)
        results = shard.query_batch(
            q.QueryBatchRequest(
                [
                    q.QueryRequest(limit=k, query=q.Query.Nearest(query, using=using), with_payload=True)
                    for query in queries
                ]
            )
        )
        return [[(p.score, dict(p.payload)) for p in points] for points in results]

    def export(self, name):
        q = self._q
        shard, offset = self._prepare(name), None
        ids, vectors, payloads = [], [], []
        while True:
            records, offset = shard.scroll(
                q.ScrollRequest(offset=offset, limit=1000, with_payload=True, with_vector=True)
            )
            for record in records:
                ids.append(str(record.id))
                vectors.append(record.vector)
                payloads.append(dict(record.payload))
            if offset is None:
                return _points(ids, vectors, payloads, self._dims(name))

    def _dims(self, name) -> dict[str, int]:
        return {n: p["size"] for n, p in self._config(name)["vectors"].items()}

    def payloads(self, name, fields):
        q = self._q
        shard, out, offset = self._shard(name), [], None
        while True:
            records, offset = shard.scroll(q.ScrollRequest(offset=offset, limit=1000, with_payload=fields))
            out.extend(dict(r.payload) for r in records)
            if offset is None:
                return out

    def count(self, name):
        return self._shard(name).count(self._q.CountRequest(exact=True))

    def exists(self, name):
        return (self._root / name / "edge_config.json").exists()

    def close(self):
        for name, shard in self._shards.items():
            if name in self._dirty:
                shard.flush()
            shard.close()
        self._shards.clear()
        self._dirty.clear()


class _ServerEngine(_Engine):
    """A Qdrant server (or qdrant-client's own local mode, for the benchmark) through qdrant-client."""

    def __init__(self, url: str | None = None, path: str | None = None):
        from qdrant_client import QdrantClient, models

        self._models = models
        self._client = QdrantClient(url=url, timeout=60) if url else QdrantClient(path=path)

    def ensure_collection(self, name, vectors, payload_indexes, sparse):
        m = self._models
        if self._client.collection_exists(name):
            params = self._client.get_collection(name).config.params.vectors
            existing = {n: p.size for n, p in params.items()} if isinstance(params, dict) else {}
            if existing != vectors:
                raise ValueError(f"collection {name!r} exists with vectors {existing}, not {vectors}")
            missing = sorted(set(sparse) - self.sparse_vectors(name))
            if missing:  # a Qdrant server adds no vector to an existing collection
                raise ValueError(f"collection {name!r} has no sparse vector {missing}: delete it and index again")
        else:
            self._client.create_collection(
                name,
                vectors_config={n: m.VectorParams(size=d, distance=m.Distance.COSINE) for n, d in vectors.items()},
                sparse_vectors_config={n: m.SparseVectorParams(modifier=m.Modifier.IDF) for n in sparse} or None,
            )
        kinds = {
            "keyword": m.PayloadSchemaType.KEYWORD,
            "integer": m.PayloadSchemaType.INTEGER,
            "float": m.PayloadSchemaType.FLOAT,
            "bool": m.PayloadSchemaType.BOOL,
        }
        for field, kind in payload_indexes.items():
            self._client.create_payload_index(name, field, kinds[kind], wait=True)

    def sparse_vectors(self, name):
        if not self.exists(name):
            return set()
        return set(self._client.get_collection(name).config.params.sparse_vectors or {})

    def _vector(self, vector):
        """A named vector (or a point's dict of them) as qdrant-client takes it."""
        if isinstance(vector, dict):
            return {n: self._vector(v) for n, v in vector.items()}
        if isinstance(vector, Sparse):
            return self._models.SparseVector(indices=list(vector.indices), values=list(vector.values))
        return vector

    def upsert(self, name, point_ids, vectors, payloads):
        m = self._models
        self._client.upsert(
            name,
            [
                m.PointStruct(id=pid, vector=self._vector(vec), payload=payload)
                for pid, vec, payload in zip(point_ids, vectors, payloads)
            ],
            wait=True,
        )

    def delete(self, name, point_ids):
        self._client.delete(name, points_selector=self._models.PointIdsList(points=point_ids), wait=True)

    def _filter(self, conditions: _Conditions):
        m = self._models
        must = []
        for field, value in conditions.equals.items():
            match = m.MatchAny(any=value) if isinstance(value, list) else m.MatchValue(value=value)
            must.append(m.FieldCondition(key=field, match=match))
        for field, bounds in conditions.ranges.items():
            must.append(m.FieldCondition(key=field, range=m.Range(**bounds)))
        must_not = [m.HasIdCondition(has_id=conditions.exclude_ids)] if conditions.exclude_ids else None
        return m.Filter(must=must or None, must_not=must_not) if must or must_not else None

    def search(self, name, query, using, k, conditions):
        points = self._client.query_points(
            name,
            query=self._vector(query),
            using=using,
            limit=k,
            query_filter=self._filter(conditions),
            with_payload=True,
        ).points
        return [(p.score, dict(p.payload)) for p in points]

    def fused_search(self, name, queries, weights, k, candidates, conditions, rrf_k):
        m = self._models
        query_filter = self._filter(conditions)
        prefetch = [
            m.Prefetch(query=self._vector(query), using=using, limit=candidates, filter=query_filter)
            for using, query in queries.items()
        ]
        points = self._client.query_points(
            name,
            prefetch=prefetch,
            query=m.RrfQuery(rrf=m.Rrf(k=rrf_k, weights=weights)),
            limit=k,
            with_payload=True,
        ).points
        return [(p.score, dict(p.payload)) for p in points]

    def search_batch(self, name, queries, using, k):
        m = self._models
        responses = self._client.query_batch_points(
            name, requests=[m.QueryRequest(query=query, using=using, limit=k, with_payload=True) for query in queries]
        )
        return [[(p.score, dict(p.payload)) for p in response.points] for response in responses]

    def export(self, name):
        params = self._client.get_collection(name).config.params.vectors
        ids, vectors, payloads, offset = [], [], [], None
        while True:
            records, offset = self._client.scroll(name, limit=1000, offset=offset, with_payload=True, with_vectors=True)
            for record in records:
                ids.append(str(record.id))
                vectors.append(record.vector)
                payloads.append(dict(record.payload))
            if offset is None:
                return _points(ids, vectors, payloads, {n: p.size for n, p in params.items()})

    def payloads(self, name, fields):
        out, offset = [], None
        while True:
            records, offset = self._client.scroll(name, limit=1000, offset=offset, with_payload=fields)
            out.extend(dict(r.payload) for r in records)
            if offset is None:
                return out

    def count(self, name):
        return self._client.count(name, exact=True).count

    def exists(self, name):
        return self._client.collection_exists(name)

    def close(self):
        self._client.close()
