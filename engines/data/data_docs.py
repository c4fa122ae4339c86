"""Data Docs that render offline: great-expectations' HTML loads Bootstrap, jQuery, bootstrap-table,
Font Awesome and Vega from CDNs, so without a network the report opens unstyled with empty tables.
After every build the links are rewritten to copies the platform ships (engines/data/data_docs_assets/,
refreshed by scripts/vendor-data-docs), placed inside the site so the folder works on its own."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

ASSETS = Path(__file__).with_name("data_docs_assets")
SITE_FOLDER = Path("static") / "mlplane_offline"  # inside the Data Docs site

# Every CDN address in great-expectations 1.24's Data Docs templates -> the shipped file.
CDN_FILES = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap.min.css",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap.min.js",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": "bootstrap-prefers-dark.css",  # noqa: E501
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": "bootstrap-datepicker.min.css",  # noqa: E501
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": "bootstrap-datepicker.min.js",  # noqa: E501
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "fontawesome/css/all.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.min.js",
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": "bootstrap-table-filter-control.min.css",  # noqa: E501
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": "bootstrap-table-filter-control.min.css",  # noqa: E501
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": "bootstrap-table-filter-control.min.js",  # noqa: E501
    "https://cdn.jsdelivr.net/npm/vega@5": "vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed.min.js",
}
# The navbar logo is fetched from great-expectations' bucket with the project's id in the query (a
# tracking request); the site ships the same image in static/images.
_GX_IMAGE = re.compile(r'"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/([\w.-]+)(?:\?[^"]*)?"')
# A stylesheet, script or image still loaded from the network after the rewrite.
_REMOTE = re.compile(
    r"""<(?:script[^>]*\ssrc|link[^>]*\shref|img[^>]*\ssrc)=["'](https?://[^"']+)["']""", re.IGNORECASE
)

log = logging.getLogger(__name__)


def make_offline(site_dir: Path) -> list[str]:
    """Copy the shipped assets into the site and point every page at them; returns the remote
    stylesheets, scripts or images left (none for great-expectations 1.24's pages), also logged."""
    target = site_dir / SITE_FOLDER
    shutil.copytree(ASSETS, target, dirs_exist_ok=True)
    remaining: set[str] = set()
    for page in site_dir.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        prefix = Path(os.path.relpath(target, page.parent)).as_posix()
        rewritten = html
        for url in sorted(CDN_FILES, key=len, reverse=True):
            rewritten = rewritten.replace(f'"{url}"', f'"{prefix}/{CDN_FILES[url]}"')
        # A crossorigin fetch of a file:// page is refused by browsers; the copies' hashes are in SOURCES.txt.
        rewritten = re.sub(
            rf'(<script[^>]*src="{re.escape(prefix)}/[^"]+")\s+integrity="[^"]*"\s+crossorigin="[^"]*"',
            r"\1",
            rewritten,
        )
        images = Path(os.path.relpath(site_dir / "static" / "images", page.parent)).as_posix()
        rewritten = _GX_IMAGE.sub(f'"{images}/\\1"', rewritten)
        if rewritten != html:
            page.write_text(rewritten, encoding="utf-8")
        remaining.update(_REMOTE.findall(rewritten))
    if remaining:
        log.warning("Data Docs still load %s from the network: add them to engines/data/data_docs.py", sorted(remaining))
    return sorted(remaining)
