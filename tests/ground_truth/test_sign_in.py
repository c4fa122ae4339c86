"""Sign-in against guessers and floods: the same work for an unknown user as for a wrong password, a
limit per account and per client address (429 with Retry-After), and the password hashing off the
shared thread pool so a flood of sign-ins does not stall the annotators' requests."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ground_truth import accounts
from ground_truth.db import connect
from ground_truth.schema import TaskSpec
from ground_truth.throttle import HashingPool, SignInThrottle
from tests.ground_truth.conftest import PASSWORD, add_task, csrf_of, login, make_accounts, serve_app

TASK = TaskSpec(name="violation", question="Copy?", labels=["violation", "ok"], annotators_per_item=1, gold_share=0.0)


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path / 'labels.db'}"
    engine = connect(url)
    make_accounts(engine, 1)
    add_task(engine, TASK, [str(i) for i in range(20)])
    return url, engine


def test_an_unknown_user_costs_the_same_hash_as_a_wrong_password(store, monkeypatch):
    _, engine = store
    accounts.sign_in(engine, "nobody", "warm up")  # the stand-in hash is made once, on first use
    real, calls = hashlib.scrypt, []

    def counted(password, **params):
        calls.append({k: v for k, v in params.items() if k != "salt"})
        return real(password, **params)

    monkeypatch.setattr(hashlib, "scrypt", counted)
    assert accounts.sign_in(engine, "annotator0", "wrong password") is None
    known = list(calls)
    calls.clear()
    assert accounts.sign_in(engine, "nobody", "wrong password") is None
    assert calls == known and len(known) == 1


def test_the_throttle_counts_failures_in_a_window_and_forgets_a_success():
    now = [0.0]
    throttle = SignInThrottle(per_account=2, per_address=3, window_s=60, clock=lambda: now[0])
    assert throttle.begin("ann", "10.0.0.1") is None
    now[0] = 10
    assert throttle.begin("ann", "10.0.0.1") is None
    assert throttle.begin("ann", "10.0.0.2") == 50  # the account's oldest attempt leaves the window in 50 s
    assert throttle.begin("bob", "10.0.0.1") is None  # the address's third
    assert throttle.begin("carol", "10.0.0.1") == 50  # the address is at its limit
    now[0] = 60.5
    assert throttle.begin("ann", "10.0.0.2") is None  # the first attempt has left the window
    throttle.succeeded("ann", "10.0.0.2")
    assert throttle.begin("ann", "10.0.0.2") is None and throttle.begin("ann", "10.0.0.2") is None


def test_sign_in_is_limited_per_account_and_per_address(store):
    url, _ = store
    with serve_app(url) as base_url:  # the defaults: 10 attempts an account, 100 an address, in 15 minutes
        wrong = [
            httpx.post(base_url + "/api/login", json={"username": "annotator0", "password": "guess"}).status_code
            for _ in range(11)
        ]
        assert wrong == [401] * 10 + [429]
        refused = httpx.post(base_url + "/api/login", json={"username": "annotator0", "password": PASSWORD})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0  # even the right one
        assert "too many sign-in attempts" in refused.json()["detail"]
        with httpx.Client(base_url=base_url) as page:
            token = csrf_of(page.get("/login"))
            form = page.post("/login", data={"username": "annotator0", "password": PASSWORD, "csrf": token})
        assert form.status_code == 429 and "try again in" in form.text and form.headers["retry-after"]
        assert httpx.post(base_url + "/api/login", json={"username": "reviewer0", "password": PASSWORD}).is_success
    with serve_app(url, throttle=SignInThrottle(per_address=3)) as base_url:
        names = ["nobody1", "nobody2", "nobody3", "reviewer0"]
        codes = [
            httpx.post(base_url + "/api/login", json={"username": n, "password": "guess"}).status_code for n in names
        ]
        assert codes == [401, 401, 401, 429]  # a fourth account from the same address


def test_a_sign_in_flood_does_not_stall_an_annotator(store):
    """60 concurrent wrong sign-ins (unknown users: each still costs a full hash) while an annotator labels
    ten items. The annotator's requests must all be answered before half the flood is: with the hashing on
    the shared pool, the flood held every thread of it and the annotator waited behind it."""
    url, _ = store
    finished: list[str] = []
    lock = threading.Lock()
    with serve_app(url) as base_url, login(base_url, "annotator0") as annotator:
        start = threading.Barrier(61)

        def guess(i: int) -> int:
            start.wait()
            code = httpx.post(
                base_url + "/api/login", json={"username": f"nobody{i}", "password": "guess"}, timeout=120
            ).status_code
            with lock:
                finished.append("sign-in")
            return code

        with ThreadPoolExecutor(60) as pool:
            flood = [pool.submit(guess, i) for i in range(60)]
            start.wait()
            time.sleep(0.2)  # let the flood reach the server first
            item = annotator.get("/api/tasks/violation/next").json()["item"]
            for _ in range(10):
                item = annotator.post(
                    "/api/tasks/violation/answers", json={"item_id": item["item_id"], "label": "ok"}
                ).json()["item"]
            with lock:
                finished.append("annotator")
            assert [f.result() for f in flood] == [401] * 60
    answered_first = finished.index("annotator")
    assert answered_first < 30, f"the annotator's ten answers came after {answered_first} of 60 sign-ins"


def test_password_checks_run_at_a_lower_cpu_priority():
    """A flood's hashing must not take the cores from the annotators' requests: its threads are niced."""
    pool = HashingPool(nice=10)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        hashing = asyncio.run(pool.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    finally:
        pool.close()
    assert hashing == min(19, own + 10)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # the caller's is untouched
