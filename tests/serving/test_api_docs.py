"""The servers' /docs page works without internet access: it names only files the server itself serves,
each answered, and a data key does not hide it (it is as open as /openapi.json)."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from serving.gateway.app import create_app as gateway_app
from tests.serving.test_gateway_exchange import gateway_over


def assert_docs_offline(client: TestClient, headers: dict | None = None) -> None:
    page = client.get("/docs", headers=headers or {})
    assert page.status_code == 200 and "swagger-ui" in page.text
    linked = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text)
    assert linked and not [url for url in linked if "://" in url or url.startswith("//")], linked
    for url in linked:
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    assert "/openapi.json" in page.text and client.get("/openapi.json").status_code == 200
    assert client.get("/redoc").status_code in (401, 404)  # no packaged ReDoc: not served (a blank page)


def test_the_gateways_docs_page_works_offline(tmp_path):
    config = gateway_over(tmp_path).config_path  # writes a config over a backend never called
    assert_docs_offline(TestClient(gateway_app(config)))
