"""The data-quality report renders offline: headless Chromium, with every request that is not a local
file refused, opens Data Docs styled and with their tables filled, and a screenshot is taken. The
same page with the CDN links great-expectations writes does not (so the check can fail)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from engines.data.data_docs import CDN_FILES, SITE_FOLDER, make_offline
from engines.data.expectations import Suite, gxe
from engines.data.quality import QualityEngine

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    engine = QualityEngine(tmp_path_factory.mktemp("quality"))
    suite = Suite(
        "interactions",
        [
            gxe.ExpectColumnValuesToNotBeNull(column="user_id"),
            gxe.ExpectColumnValuesToBeBetween(column="price", min_value=0),
        ],
    )
    engine.validate(suite, pd.DataFrame({"user_id": [1, 2, 3], "price": [1.0, 2.0, 3.0]}), "interactions 2026-01-01")
    engine.validate(
        suite, pd.DataFrame({"user_id": [1, None, 3], "price": [1.0, -2.0, 3.0]}), "interactions 2026-01-02"
    )
    return engine.build_docs().parent


def open_offline(chromium, page_path: Path, screenshot: Path) -> dict:
    """Load a page with the network cut off; what rendered, and what was refused."""
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    refused: list[str] = []

    def only_files(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", only_files)
    page.goto(page_path.as_uri(), wait_until="networkidle")  # bootstrap-table fills the tables on ready
    rendered = page.evaluate("""() => ({
        jquery: typeof window.jQuery === 'function',
        bootstrapTable: !!(window.jQuery && window.jQuery.fn.bootstrapTable),
        rows: document.querySelectorAll('table tbody tr').length,
        navbarHeight: document.querySelector('nav') ? document.querySelector('nav').getBoundingClientRect().height : 0,
        bodyFont: getComputedStyle(document.body).fontFamily,
        iconFont: document.querySelector('.fas, .fa') ?
            getComputedStyle(document.querySelector('.fas, .fa'), '::before').fontFamily : null,
    })""")
    page.screenshot(path=str(screenshot), full_page=True)
    page.close()
    return {**rendered, "refused": refused}


@pytest.mark.services  # a browser
def test_data_docs_render_offline_with_styles_and_filled_tables(site, chromium, tmp_path):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 4  # index, the suite, a page per validation
    assert make_offline(site) == []  # no stylesheet or script left on the network

    index = open_offline(chromium, site / "index.html", tmp_path / "index.png")
    assert index["refused"] == []
    assert index["jquery"] and index["bootstrapTable"]
    assert index["rows"] >= 3  # the suite and both validation runs are listed
    assert "apple-system" in index["bodyFont"]  # Bootstrap 4's font stack: its CSS is applied
    assert (tmp_path / "index.png").stat().st_size > 20_000

    [failed_run] = [p for p in pages if "interactions 2026-01-02" in str(p)]
    validation = open_offline(chromium, failed_run, tmp_path / "validation.png")
    assert validation["refused"] == []
    assert validation["rows"] >= 2
    assert "Font Awesome" in (validation["iconFont"] or "")  # the failed-result icons have their font


@pytest.mark.services  # a browser
def test_the_cdn_links_great_expectations_writes_leave_the_report_empty_offline(site, chromium, tmp_path):
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    shutil.rmtree(copy / SITE_FOLDER)
    html = (copy / "index.html").read_text()
    for url, name in CDN_FILES.items():
        html = html.replace(f'"{SITE_FOLDER.as_posix()}/{name}"', f'"{url}"')
    (copy / "index.html").write_text(html)

    index = open_offline(chromium, copy / "index.html", tmp_path / "cdn.png")
    assert index["refused"]  # it asked the network
    assert not index["bootstrapTable"] and index["rows"] == 0
