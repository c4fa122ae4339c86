"""Label Studio as the labeling benchmark's peer: the same loop (answer, then the next item) through its
own HTTP API, with browser-style sessions (1.23 disables legacy API tokens by default). Label Studio
runs in an environment of its own; it does not install beside our pins:

    python3.11 -m venv /tmp/ls && /tmp/ls/bin/pip install label-studio==1.23.2
    LABEL_STUDIO_BASE_DATA_DIR=/tmp/lsdata LABEL_STUDIO_USERNAME=admin@example.com \\
      LABEL_STUDIO_PASSWORD=benchmark-pass /tmp/ls/bin/label-studio start --no-browser --port 8090
"""

from __future__ import annotations

import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

CONFIG = (
    '<View><Text name="t" value="$title"/><Choices name="c" toName="t">'
    '<Choice value="violation"/><Choice value="ok"/></Choices></View>'
)


def _session(base_url: str, email: str, password: str, signup: bool = False) -> httpx.Client:
    http = httpx.Client(base_url=base_url, timeout=120)
    path = "/user/signup/" if signup else "/user/login/"
    http.get(path)
    form = {"email": email, "password": password, "csrfmiddlewaretoken": http.cookies.get("csrftoken")}
    answer = http.post(path, data=form, headers={"Referer": base_url + path})
    if answer.status_code not in (302, 303):
        raise RuntimeError(f"Label Studio {path}: {answer.status_code} {answer.text[:200]}")
    http.headers.update({"X-CSRFToken": http.cookies.get("csrftoken"), "Referer": base_url})
    return http


def _label_all(http: httpx.Client, project: int, think_seconds: float, seed: int) -> list[float]:
    pauses = random.Random(seed)
    trips: list[float] = []
    result = [{"from_name": "c", "to_name": "t", "type": "choices", "value": {"choices": ["ok"]}}]
    task = http.get(f"/api/projects/{project}/next")
    while task.status_code == 200 and task.json().get("id"):
        if think_seconds:
            time.sleep(pauses.expovariate(1 / think_seconds))
        started = time.perf_counter()
        saved = http.post(f"/api/tasks/{task.json()['id']}/annotations/?project={project}", json={"result": result})
        saved.raise_for_status()
        task = http.get(f"/api/projects/{project}/next")
        trips.append(time.perf_counter() - started)
    return trips


def run(
    base_url: str, admin: str, annotators: int, items: int, k: int, think_seconds: float
) -> tuple[int, float, list[float]]:
    """(answers, seconds, round trips in seconds) of `annotators` new accounts labelling a new project."""
    email, password = admin.split(":", 1)
    owner = _session(base_url, email, password)
    created = owner.post(
        "/api/projects/",
        json={"title": f"bench {uuid.uuid4().hex[:6]}", "label_config": CONFIG, "maximum_annotations": k},
    )
    created.raise_for_status()
    project = created.json()["id"]
    owner.post(
        f"/api/projects/{project}/import", json=[{"title": f"item {i}"} for i in range(items)]
    ).raise_for_status()
    people = [
        _session(base_url, f"bench{i}-{project}@example.com", "benchmark-pass", signup=True) for i in range(annotators)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=annotators) as pool:
        trips = list(pool.map(lambda p: _label_all(p[1], project, think_seconds, p[0]), enumerate(people)))
    return sum(map(len, trips)), time.perf_counter() - started, [t for ts in trips for t in ts]
