"""The labeling app against cross-site request forgery and cookie theft: every form needs its CSRF field,
every state-changing API call on the session cookie the CSRF header of the app's pages, a request that
another site's page started is refused, and cookies are Secure everywhere but on localhost."""

from __future__ import annotations

import httpx
import pytest

from ground_truth import accounts
from ground_truth.db import connect
from ground_truth.schema import TaskSpec
from tests.ground_truth.conftest import PASSWORD, add_task, browser, csrf_of, login, make_accounts, serve_app

TASK = TaskSpec(name="violation", question="Copy?", labels=["violation", "ok"], annotators_per_item=1, gold_share=0.0)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('csrf') / 'labels.db'}"
    engine = connect(url)
    make_accounts(engine, 2)
    add_task(engine, TASK, [str(i) for i in range(10)])
    with serve_app(url) as base_url:
        yield base_url, engine


def test_sign_in_form_needs_the_pages_csrf_token(app):
    app_url, _ = app
    with httpx.Client(base_url=app_url) as client:
        form = {"username": "annotator0", "password": PASSWORD}
        missing = client.post("/login", data=form)  # no field, no cookie: a forged form
        assert missing.status_code == 403 and "CSRF token" in missing.text
        assert missing.headers["content-type"].startswith("text/html") and "gt_session" not in missing.cookies
        token = csrf_of(client.get("/login"))
        forged = client.post("/login", data={**form, "csrf": "guessed"})
        assert forged.status_code == 403
        signed = client.post("/login", data={**form, "csrf": token})
        assert signed.status_code == 303 and signed.cookies.get("gt_session")


def test_sign_out_and_api_calls_on_the_cookie_need_the_token(app):
    app_url, _ = app
    with browser(app_url, "annotator0") as client:
        item = client.get("/api/tasks/violation/next").json()["item"]  # reading needs no token
        body = {"item_id": item["item_id"], "label": "ok"}
        refused = client.post("/api/tasks/violation/answers", json=body)
        assert refused.status_code == 403 and "x-csrf-token" in refused.json()["detail"]
        wrong = client.post("/api/tasks/violation/answers", json=body, headers={"x-csrf-token": "guessed"})
        assert wrong.status_code == 403
        saved = client.post("/api/tasks/violation/answers", json=body, headers={"x-csrf-token": client.csrf})
        assert saved.status_code == 200 and saved.json()["item"]["item_id"] != item["item_id"]
        assert client.post("/logout").status_code == 403  # a forged sign-out signs nobody out
        assert client.get("/").status_code == 200
        out = client.post("/logout", data={"csrf": client.csrf})
        assert out.status_code == 303
        assert client.get("/").status_code == 303  # signed out


def test_a_request_started_by_another_site_is_refused(app):
    app_url, _ = app
    evil = {"origin": "https://evil.example"}
    with browser(app_url, "annotator0") as client:
        item = client.get("/api/tasks/violation/next").json()["item"]
        forged = client.post(
            "/api/tasks/violation/skip",
            json={"item_id": item["item_id"]},
            headers={**evil, "x-csrf-token": client.csrf},
        )
        assert forged.status_code == 403 and "cross-site" in forged.json()["detail"]
        ours = client.post(
            "/api/tasks/violation/skip",
            json={"item_id": item["item_id"]},
            headers={"origin": app_url, "x-csrf-token": client.csrf},
        )
        assert ours.status_code == 200
    sign_in = httpx.post(app_url + "/api/login", json={"username": "annotator1", "password": PASSWORD}, headers=evil)
    assert sign_in.status_code == 403


def test_a_bearer_token_needs_no_csrf_token(app):
    app_url, _ = app
    with login(app_url, "annotator1") as client:  # scripts and the simulated annotators: no ambient credential
        item = client.get("/api/tasks/violation/next").json()["item"]
        answer = client.post("/api/tasks/violation/answers", json={"item_id": item["item_id"], "label": "ok"})
        assert answer.status_code == 200


def cookie_flags(response: httpx.Response, name: str) -> set[str]:
    (header,) = [h for h in response.headers.get_list("set-cookie") if h.startswith(name + "=")]
    return {part.strip().lower() for part in header.split(";")[1:]}


def test_cookies_are_secure_outside_localhost(app):
    app_url, _ = app
    for host, secure in (("labels.example.com", True), ("127.0.0.1", False), ("localhost", False)):
        page = httpx.get(app_url + "/login", headers={"host": host})
        assert ("secure" in cookie_flags(page, "gt_csrf")) is secure, host
        token = csrf_of(page)
        signed = httpx.post(
            app_url + "/login",
            data={"username": "annotator1", "password": PASSWORD, "csrf": token},
            headers={"host": host, "cookie": f"gt_csrf={token}"},
        )
        flags = cookie_flags(signed, "gt_session")
        assert ("secure" in flags) is secure and {"httponly", "samesite=strict"} <= flags, (host, flags)


def test_an_expired_session_is_refused_and_sign_in_returns_to_the_page(app):
    app_url, engine = app
    with browser(app_url, "annotator1") as client:
        assert client.get("/api/tasks").status_code == 200
        accounts.sign_out(engine, client.cookies["gt_session"])  # what expiry does: the session is gone
        assert client.get("/api/tasks").status_code == 401
        page = client.get("/label/violation")
        assert page.status_code == 303 and page.headers["location"] == "/login?next=%2Flabel%2Fviolation"
        form = client.get(page.headers["location"])
        assert 'name="next" value="/label/violation"' in form.text
        data = {"username": "annotator1", "password": PASSWORD, "csrf": csrf_of(form), "next": "/label/violation"}
        back = client.post("/login", data=data)
        assert back.status_code == 303 and back.headers["location"] == "/label/violation"
        away = client.post("/login", data={**data, "next": "//evil.example/x"})
        assert away.headers["location"] == "/"  # never to another site
