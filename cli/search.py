"""`mlplane search`: multimodal item search from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("text", required=False)
@click.option(
    "--image",
    "image",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Search with an image instead of text.",
)
@click.option("-k", "--top-k", "k", default=10, show_default=True)
@click.option("--category", multiple=True, help="Only these categories (repeatable).")
@click.option("--price-min", type=float, default=None)
@click.option("--price-max", type=float, default=None)
@click.option(
    "--using",
    type=click.Choice(["image", "text"]),
    default="image",
    show_default=True,
    help="Compare the query with item thumbnails or item titles.",
)
@click.option("--max-faces", type=int, default=None, help="Only items whose mesh has at most this many faces.")
@click.option("--watertight", is_flag=True, help="Only items with a watertight mesh.")
@click.option(
    "--dense-only", is_flag=True, help="CLIP vectors alone, without the keyword search fused in (to compare)."
)
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def search(
    text: str | None,
    image: Path | None,
    k: int,
    category: tuple[str, ...],
    price_min: float | None,
    price_max: float | None,
    using: str,
    max_faces: int | None,
    watertight: bool,
    dense_only: bool,
    data_dir: str | None,
) -> None:
    """Top-k catalogue items for a TEXT query (or --image PATH), with optional filters. A TEXT query
    fuses the CLIP search with a keyword search of titles, descriptions and categories."""
    from engines.retrieval import clip_registry
    from engines.retrieval.geometry_job import current_geometry
    from engines.retrieval.search import ItemSearch
    from orchestration.profiles import open_resource

    if (text is None) == (image is None):
        raise click.UsageError("give a TEXT query or --image PATH (not both)")
    with (
        open_resource("lake", data_dir) as lake,
        open_resource("vector_store", data_dir) as vectors,
        open_resource("model_registry", data_dir) as registry,
    ):
        try:  # the registry's champion CLIP, whose vectors alone the query is compared with
            spec, version, _ = clip_registry.champion(
                registry.get_client(), clip_registry.cache_folder(lake.get_client().root)
            )
        except LookupError as error:
            raise click.ClickException(str(error)) from error
        with vectors.get_client() as store:
            try:
                search = ItemSearch(store, spec, current_geometry(lake.get_client()), model_version=version)
                hits = search.search(
                    text=text,
                    image=image,
                    k=k,
                    category=list(category) or None,
                    price_min=price_min,
                    price_max=price_max,
                    using=using,
                    max_faces=max_faces,
                    watertight=watertight,
                    dense_only=dense_only,
                )
            except (ValueError, KeyError) as error:
                raise click.ClickException(str(error)) from error
    for hit in hits:
        click.echo(
            json.dumps(
                {
                    "item_id": hit.payload.get("item_id", hit.id),
                    "score": round(hit.score, 4),
                    **{f: hit.payload.get(f) for f in ("title", "category", "price", "flags")},
                }
            )
        )
