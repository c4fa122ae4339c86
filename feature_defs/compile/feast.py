"""Compile the catalogue to Feast objects: Entity, FileSource, PushSource, FeatureView, FeatureService."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from feast import Entity, FeatureService, FeatureView, Field, FileSource, PushSource, ValueType
from feast.data_format import ParquetFormat
from feast.types import Array, Bool, Float64, Int64, String, UnixTimestamp

from feature_defs import dsl
from feature_defs.compile.polars import TIMESTAMP
from feature_defs.outputs import OutputView, all_outputs

FEAST_TYPES = {
    "int64": Int64,
    "float64": Float64,
    "string": String,
    "bool": Bool,
    "timestamp": UnixTimestamp,
    "int64_list": Array(Int64),
    "float64_list": Array(Float64),
    "string_list": Array(String),
}
VALUE_TYPES = {"int64": ValueType.INT64, "string": ValueType.STRING}

# Daily rows are recomputed every day, so a row older than a day is stale; a dimension row holds
# until the next change (0 means no expiry in Feast).
DAILY_TTL = timedelta(days=1)


def offline_table_glob(offline_root: Path, table: str) -> str:
    return str(offline_root / table / "*" / "*.parquet")


def feast_objects(catalogue: dsl.Catalogue, offline_root: Path) -> list:
    """Every Feast object of the catalogue and of the platform's output views, ready for FeatureStore.apply()."""
    entities = {e.name: _entity(e) for e in catalogue.entities}
    objects: list = list(entities.values())
    views: dict[str, FeatureView] = {}
    for view in catalogue.views:
        batch = FileSource(
            name=f"{view.name}_offline",
            path=offline_table_glob(offline_root, view.name),
            file_format=ParquetFormat(),
            timestamp_field=TIMESTAMP,
            description=f"Offline table of {view.name}, one Parquet partition per day",
        )
        source = PushSource(name=view.push_source_name, batch_source=batch) if view.streaming else batch
        views[view.name] = FeatureView(
            name=view.name,
            entities=[entities[e.name] for e in view.entities],
            ttl=timedelta(0) if view.is_table_view else DAILY_TTL,
            schema=[
                Field(name=f.name, dtype=FEAST_TYPES[view.dtype_of(f)], description=f.description)
                for f in view.features
            ],
            source=source,
            online=True,
            description=view.description,
            owner=view.owner,
            tags={**view.tags, "source": view.source.name, "streaming": str(view.streaming).lower()},
        )
        objects += [batch, source] if view.streaming else [batch]
    objects += views.values()
    objects += [
        FeatureService(name=s.name, features=[views[v.name] for v in s.views], description=s.description, owner=s.owner)
        for s in catalogue.services
    ]
    for output in all_outputs:
        objects += _output_objects(output, entities[output.entity.name], offline_root)
    return objects


def _output_objects(output: OutputView, entity: Entity, offline_root: Path) -> list:
    batch = FileSource(
        name=f"{output.name}_offline",
        path=offline_table_glob(offline_root, output.name),
        file_format=ParquetFormat(),
        timestamp_field=TIMESTAMP,
        description=f"Offline table of {output.name}, one Parquet partition per day",
    )
    view = FeatureView(
        name=output.name,
        entities=[entity],
        ttl=timedelta(0),
        source=batch,
        online=True,
        schema=[Field(name=name, dtype=FEAST_TYPES[dtype]) for name, dtype in output.schema.items()],
        description=output.description,
        owner=output.owner,
        tags={"produced_by": "mlplane"},
    )
    service = FeatureService(name=output.service, features=[view], description=output.description, owner=output.owner)
    return [batch, view, service]


def _entity(e: dsl.Entity) -> Entity:
    return Entity(name=e.name, join_keys=[e.join_key], value_type=VALUE_TYPES[e.dtype], description=e.description)
