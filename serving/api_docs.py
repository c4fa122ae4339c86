"""The interactive API page of a server, from files installed with the package: FastAPI's default `/docs`
and `/redoc` load their scripts from a CDN, so on a host without internet access they are blank pages.
Swagger UI is served from the `swagger-ui-bundle` package; ReDoc has no packaged copy and is off."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS = "/docs"
ASSETS = "/docs/assets"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"

# keyword arguments for FastAPI(...): its own pages off, `add_offline_docs` serves the page
NO_CDN_PAGES = {"docs_url": None, "redoc_url": None}


def add_offline_docs(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=OAUTH2_REDIRECT,
        )

    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    app.add_api_route(DOCS, docs, methods=["GET"], include_in_schema=False)
    app.add_api_route(OAUTH2_REDIRECT, oauth2_redirect, methods=["GET"], include_in_schema=False)


def is_docs_path(path: str) -> bool:
    return path in (DOCS, OAUTH2_REDIRECT) or path.startswith(ASSETS + "/")
