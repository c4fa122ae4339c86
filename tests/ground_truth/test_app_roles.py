"""Every page and API route against every role: the admitted roles get through, the others 403, and
nobody signed in gets 401 (API) or a redirect to /login (pages). Bad input gets a 4xx naming it."""

from __future__ import annotations

import httpx
import pytest

from ground_truth.db import connect
from ground_truth.pages import login_url
from ground_truth.schema import TaskSpec
from tests.ground_truth.conftest import PASSWORD, add_task, browser, login, make_accounts, serve_app

TASK = TaskSpec(name="violation", question="Copy?", labels=["violation", "ok"], annotators_per_item=2, gold_share=0.0)
ANN, REV, ADM = "annotator", "reviewer", "admin"
NEW_TASK = {"name": "other", "question": "q?", "labels": ["a", "b"]}

# method, path, JSON body, roles admitted
API = [
    ("GET", "/api/tasks", None, {ANN, REV, ADM}),
    ("GET", "/api/tasks/violation/next", None, {ANN}),
    ("POST", "/api/tasks/violation/answers", {"item_id": 1, "label": "ok"}, {ANN}),
    ("POST", "/api/tasks/violation/skip", {"item_id": 1}, {ANN}),
    ("POST", "/api/tasks/violation/undo", None, {ANN}),
    ("GET", "/api/tasks/violation/disputes", None, {REV, ADM}),
    ("POST", "/api/tasks/violation/verdicts", {"item_id": 1, "label": "ok"}, {REV, ADM}),
    ("DELETE", "/api/tasks/violation/verdicts/1", None, {REV, ADM}),
    ("GET", "/api/tasks/violation/quality", None, {REV, ADM}),
    ("GET", "/api/tasks/violation/progress", None, {ANN}),
    ("GET", "/api/accounts", None, {ADM}),
    ("POST", "/api/accounts", {"username": "new", "password": PASSWORD, "role": "annotator"}, {ADM}),
    ("POST", "/api/tasks", NEW_TASK, {ADM}),
    ("POST", "/api/tasks/violation/items", [{"key": "9", "queue": "audit"}], {ADM}),
]
PAGES = [
    ("/", {ANN, REV, ADM}),
    ("/label/violation", {ANN}),
    ("/review/violation", {REV, ADM}),
    ("/admin", {ADM}),
]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('roles') / 'labels.db'}"
    engine = connect(url)
    make_accounts(engine, 1)
    add_task(engine, TASK, ["1", "2"])
    with serve_app(url) as base_url:
        yield base_url


@pytest.mark.parametrize("role", [ANN, REV, ADM])
@pytest.mark.parametrize(("method", "path", "body", "admitted"), API, ids=[f"{m} {p}" for m, p, _, _ in API])
def test_api_route_by_role(app_url, role, method, path, body, admitted):
    with login(app_url, f"{role}0") as client:
        response = client.request(method, path, json=body)
    if role in admitted:
        assert response.status_code not in (401, 403), response.text  # 409 (e.g. nothing held) is fine
    else:
        assert response.status_code == 403, response.text
        assert f"a {role} may not" in response.json()["detail"]


@pytest.mark.parametrize(("method", "path", "body", "admitted"), API, ids=[f"{m} {p}" for m, p, _, _ in API])
def test_api_route_without_sign_in(app_url, method, path, body, admitted):
    response = httpx.request(method, app_url + path, json=body)
    assert response.status_code == 401


@pytest.mark.parametrize("role", [ANN, REV, ADM])
@pytest.mark.parametrize(("path", "admitted"), PAGES, ids=[p for p, _ in PAGES])
def test_page_by_role(app_url, role, path, admitted):
    with browser(app_url, f"{role}0") as client:  # the form sets the cookie
        response = client.get(path)
    assert response.status_code == (200 if role in admitted else 403), response.text
    assert response.headers["content-type"].startswith("text/html")  # a page, also when refused
    assert response.headers["cache-control"] == "no-store"  # Back after sign-out shows no signed-in page
    anonymous = httpx.get(app_url + path)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == login_url(path)


def test_bad_input_gets_a_4xx_naming_the_problem(app_url):
    with login(app_url, "annotator0") as client:
        assert client.get("/api/tasks/nope/next").json()["detail"] == "no task 'nope'"
        item = client.get("/api/tasks/violation/next").json()["item"]
        wrong = client.post("/api/tasks/violation/answers", json={"item_id": item["item_id"], "label": "maybe"})
        assert wrong.status_code == 422 and "label must be one of" in wrong.json()["detail"]
        missing = client.post("/api/tasks/violation/answers", json={"label": "ok"})
        assert missing.status_code == 422 and "item_id" in missing.text
        stranger = client.post("/api/tasks/violation/answers", json={"item_id": 999, "label": "ok"})
        assert stranger.status_code == 409 and "not assigned to you" in stranger.json()["detail"]
    assert httpx.post(app_url + "/api/login", json={"username": "annotator0", "password": "nope"}).status_code == 401
    with login(app_url, "admin0") as admin:
        duplicate = admin.post(
            "/api/accounts", json={"username": "annotator0", "password": PASSWORD, "role": "annotator"}
        )
        assert duplicate.status_code == 409
        bad_task = admin.post("/api/tasks", json={"name": "x", "question": "q", "labels": ["a", "a"]})
        assert bad_task.status_code == 422
