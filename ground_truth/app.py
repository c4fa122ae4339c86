"""The labeling web app: a JSON API (used by the pages' scripts, the simulated annotators and the
benchmark) and server-rendered pages. Every route names the roles it admits; others get 403. Errors are
JSON under /api/ and HTML pages elsewhere; state-changing browser requests are CSRF-checked (guard.py).
(No `from __future__ import annotations`: FastAPI resolves the routes' Annotated aliases at definition.)"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool

from ground_truth import accounts as acc
from ground_truth import guard, originals, pages, review, seen
from ground_truth import queue as q
from ground_truth.db import connect
from ground_truth.errors import Throttled, install_error_pages
from ground_truth.refit import RefitPolicy, Refitter
from ground_truth.schema import ItemIn, Role, Shown, TaskSpec
from ground_truth.throttle import HashingPool, SignInThrottle

COOKIE = "gt_session"
STATIC = Path(__file__).parent / "static"
ANNOTATOR, REVIEWERS, ADMIN = (Role.annotator,), (Role.reviewer, Role.admin), (Role.admin,)


class Credentials(BaseModel):
    username: str = Field(max_length=64)
    password: str = Field(max_length=200)


class NewAccount(Credentials):
    role: Role


class Answer(BaseModel):
    item_id: int
    label: str = Field(max_length=2000)


class ItemRef(BaseModel):
    item_id: int


class Next(BaseModel):
    item: Shown | None
    retry: bool = False  # the answer is saved but the next item could not be claimed yet: GET .../next
    original: originals.Original | None = None  # what the item may copy, shown beside it


class Access:
    """Who is calling (bearer token or session cookie) and what they may do; the tasks by name."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.known_tasks: dict[str, q.Task] = {}

    def signed_in(self, request: Request) -> acc.Account:
        return self.caller(request, form_checked=False)

    def caller(self, request: Request, form_checked: bool) -> acc.Account:
        """The signed-in account. A state-changing call on the session cookie must pass the CSRF check:
        the header of the pages' scripts here, or a form's field (`form_checked`: done by the route)."""
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer "):
            token = header.removeprefix("Bearer ").strip()
        else:
            token = request.cookies.get(COOKIE)
            if token and not form_checked:
                guard.check_cookie_call(request)  # the cookie rides along with any site's request
        account = acc.account_for(self.engine, token) if token else None
        if account is None:
            raise HTTPException(401, "sign in first (POST /api/login or the /login page)")
        return account

    # the role check and the task lookup are async: pure or cached, they need no threadpool hop (each
    # sync dependency is one, and under 20 annotators the hops were a part of every round trip)
    def require(self, *roles: Role):
        async def check(account: Annotated[acc.Account, Depends(self.signed_in)]) -> acc.Account:
            if account.role not in roles:
                raise HTTPException(
                    403, f"a {account.role.value} may not do this (needs {' or '.join(r.value for r in roles)})"
                )
            return account

        return check

    async def task_named(self, task: str) -> q.Task:
        # a task's spec never changes (create_task refuses another spec) and tasks are not deleted, so
        # one read per task and process; an unknown name is read again each time (another process may add it)
        if task not in self.known_tasks:
            self.known_tasks[task] = await run_in_threadpool(q.get_task, self.engine, task)
        return self.known_tasks[task]


def create_app(
    database_url: str,
    media_root: Path | None = None,
    throttle: SignInThrottle | None = None,
    refit: RefitPolicy | None = RefitPolicy(),  # noqa: B008 (frozen)
) -> FastAPI:
    """`refit`: how the annotator models of adaptive tasks are refitted while the app runs (None: never)."""
    engine = connect(database_url)
    originals.create_table(engine)
    refitter = Refitter(engine, refit) if refit is not None else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if refitter is not None:
            refitter.start()
        yield
        if refitter is not None:
            refitter.stop()

    app = FastAPI(title="mlplane labeling", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.engine = engine
    app.state.sign_in = SignIn(engine, throttle or SignInThrottle(), HashingPool())
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    install_error_pages(app)
    app.add_middleware(ApiNotStored)
    access = Access(engine)
    _labeling_api(app, access)
    _review_api(app, access)
    _admin_api(app, access)
    _pages(app, access, media_root)
    return app


def _labeling_api(app: FastAPI, access: Access) -> None:
    engine = access.engine
    Anyone = Annotated[acc.Account, Depends(access.signed_in)]
    Annotator = Annotated[acc.Account, Depends(access.require(*ANNOTATOR))]
    TaskDep = Annotated[q.Task, Depends(access.task_named)]

    original_of = originals.Lookup(engine)

    def with_original(task: q.Task, item: Shown | None, retry: bool = False) -> Next:
        return Next(item=item, retry=retry, original=original_of(task, item.item_id) if item else None)

    @app.post("/api/login")
    async def api_login(request: Request, body: Credentials) -> dict:
        guard.check_origin(request)
        token = await app.state.sign_in(request, body.username, body.password)
        if token is None:
            raise HTTPException(401, "wrong username or password")
        response = JSONResponse({"token": token})
        guard.set_cookie(request, response, COOKIE, token)
        return response

    @app.get("/api/tasks")
    def api_tasks(account: Anyone) -> list[TaskSpec]:
        return [t.spec for t in q.list_tasks(engine)]

    @app.get("/api/tasks/{task}/next")
    def api_next(account: Annotator, task: TaskDep) -> Next:
        return with_original(task, q.serve(engine, task, account.id))

    @app.post("/api/tasks/{task}/answers")
    def api_answer(body: Answer, account: Annotator, task: TaskDep) -> Next:
        item, retry = q.answer_and_serve(engine, task, account.id, body.item_id, body.label)
        return with_original(task, item, retry)

    @app.post("/api/tasks/{task}/skip")
    def api_skip(body: ItemRef, account: Annotator, task: TaskDep) -> Next:
        q.skip(engine, task, account.id, body.item_id)
        try:
            return with_original(task, q.serve(engine, task, account.id))
        except q.Busy:
            return Next(item=None, retry=True)

    @app.post("/api/tasks/{task}/undo")
    def api_undo(account: Annotator, task: TaskDep) -> Next:
        return with_original(task, q.undo(engine, task, account.id))

    @app.get("/api/tasks/{task}/progress")
    def api_progress(account: Annotator, task: TaskDep) -> dict:
        done = seen.progress(engine, task, account.id)
        return {
            "done": done.done,
            "remaining": done.remaining,
            "gold_scored": done.gold_scored,
            "gold_correct": done.gold_correct,
            "gold_accuracy": done.gold_accuracy,
            "scored_through": done.scored_through,
        }


def _review_api(app: FastAPI, access: Access) -> None:
    engine = access.engine
    Reviewer = Annotated[acc.Account, Depends(access.require(*REVIEWERS))]
    TaskDep = Annotated[q.Task, Depends(access.task_named)]

    @app.get("/api/tasks/{task}/disputes")
    def api_disputes(account: Reviewer, task: TaskDep) -> list[dict]:
        return [pages.dispute_json(s) for s in review.disputes(engine, task)]

    @app.post("/api/tasks/{task}/verdicts")
    def api_verdict(body: Answer, account: Reviewer, task: TaskDep) -> dict:
        review.adjudicate(engine, task, account.id, body.item_id, body.label)
        return {"item_id": body.item_id, "verdict": body.label}

    @app.delete("/api/tasks/{task}/verdicts/{item_id}")
    def api_undo_verdict(item_id: int, account: Reviewer, task: TaskDep) -> dict:
        seen.undo_verdict(engine, task, account, item_id)
        return {"item_id": item_id, "verdict": None}

    @app.get("/api/tasks/{task}/quality")
    def api_quality(account: Reviewer, task: TaskDep) -> dict:
        return pages.quality_json(review.task_quality(engine, task))


def _admin_api(app: FastAPI, access: Access) -> None:
    engine = access.engine
    Admin = Annotated[acc.Account, Depends(access.require(*ADMIN))]
    TaskDep = Annotated[q.Task, Depends(access.task_named)]

    @app.get("/api/accounts")
    def api_accounts(account: Admin) -> list[dict]:
        return [{"username": a.username, "role": a.role.value} for a in acc.list_accounts(engine)]

    @app.post("/api/accounts", status_code=201)
    def api_create_account(body: NewAccount, account: Admin) -> dict:
        created = acc.create_account(engine, body.username, body.password, body.role)
        return {"username": created.username, "role": created.role.value}

    @app.post("/api/tasks", status_code=201)
    def api_create_task(body: TaskSpec, account: Admin) -> TaskSpec:
        return q.create_task(engine, body).spec

    @app.post("/api/tasks/{task}/items")
    def api_add_items(body: list[ItemIn], account: Admin, task: TaskDep) -> dict:
        return {"added": q.add_items(engine, task, body)}


class ApiNotStored:
    """`Cache-Control: no-store` on every API answer. Without it a browser going Back or Forward reuses
    the stored answer of an earlier GET .../next and shows an item the annotator already answered."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            return await self.app(scope, receive, send)

        async def not_stored(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"cache-control", b"no-store")]
            await send(message)

        await self.app(scope, receive, not_stored)


def _page(request: Request, html: str, status: int = 200) -> HTMLResponse:
    """A page: never stored (Back after sign-out must not show a signed-in page), with the CSRF cookie
    its forms and script echo."""
    response = HTMLResponse(html, status, headers={"cache-control": "no-store"})
    guard.remember_csrf(request, response)
    return response


def _page_account(access: Access, request: Request, roles: tuple[Role, ...] | None = None) -> acc.Account:
    """The account behind a page or form (a form's CSRF field is checked by its route first); without one,
    a redirect to the sign-in page that comes back here."""
    try:
        account = access.caller(request, form_checked=True)
    except HTTPException as error:
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, headers={"location": pages.login_url(back)}) from error
    if roles is not None and account.role not in roles:
        raise HTTPException(403, f"a {account.role.value} may not open this page")
    return account


def _pages(app: FastAPI, access: Access, media_root: Path | None) -> None:
    _sign_in_pages(app, access)
    _task_pages(app, access)
    _admin_pages(app, access)
    _media_files(app, access, media_root)


def _task_pages(app: FastAPI, access: Access) -> None:
    engine = access.engine

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request):
        account = _page_account(access, request)
        return _page(request, pages.home(account, q.list_tasks(engine), guard.csrf_token(request)))

    @app.get("/label/{task}", response_class=HTMLResponse)
    def label_page(request: Request, task: str):
        account = _page_account(access, request, ANNOTATOR)
        return _page(request, pages.label(account, q.get_task(engine, task), guard.csrf_token(request)))

    @app.get("/review/{task}", response_class=HTMLResponse)
    def review_page(request: Request, task: str):
        account = _page_account(access, request, REVIEWERS)  # before the lookup: a stranger learns no task names
        found = q.get_task(engine, task)
        states = review.disputes(engine, found)
        shown = {s.item_id: originals.of_item(engine, s.item_id) for s in states}
        html = pages.review(
            account, found, states, review.task_quality(engine, found), shown, guard.csrf_token(request)
        )
        return _page(request, html)


def _admin_pages(app: FastAPI, access: Access) -> None:
    engine = access.engine

    @app.get("/admin", response_class=HTMLResponse)
    def admin_page(request: Request, created: str | None = None):
        account = _page_account(access, request, ADMIN)
        people, tasks = acc.list_accounts(engine), q.list_tasks(engine)
        return _page(request, pages.admin(account, people, tasks, guard.csrf_token(request), created=created))

    @app.post("/admin/accounts")
    def admin_create_account(
        request: Request,
        username: Annotated[str, Form(max_length=64)],
        password: Annotated[str, Form(max_length=200)],
        role: Annotated[Role, Form()],
        csrf: Annotated[str | None, Form(max_length=100)] = None,
    ):
        guard.check_form(request, csrf)
        account = _page_account(access, request, ADMIN)
        try:
            acc.create_account(engine, username, password, role)
        except ValueError as error:  # a bad name or password, or the account exists: say so on the page
            people, tasks = acc.list_accounts(engine), q.list_tasks(engine)
            html = pages.admin(account, people, tasks, guard.csrf_token(request), problem=str(error))
            return _page(request, html, 409 if isinstance(error, acc.AccountExists) else 422)
        return RedirectResponse(f"/admin?created={username}", status_code=303)


def _media_files(app: FastAPI, access: Access, media_root: Path | None) -> None:
    engine = access.engine

    @app.get("/media/{path:path}")
    def media(request: Request, path: str):
        account = _page_account(access, request)
        # only a file an item the caller may see shows, never the rest of the media root
        if media_root is None or not _plain_path(path) or not seen.may_see_media(engine, account, path):
            raise HTTPException(404, f"no media file {path!r}")
        root = media_root.resolve()
        file = (root / path).resolve()
        if not file.is_relative_to(root) or not file.is_file():
            raise HTTPException(404, f"no media file {path!r}")
        return FileResponse(file)


def _sign_in_pages(app: FastAPI, access: Access) -> None:
    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request, error: str | None = None, next: str = "/"):
        return _page(request, pages.login(error, guard.csrf_token(request), pages.local_path(next)))

    @app.post("/login")
    async def login_form(
        request: Request,
        username: Annotated[str, Form(max_length=64)],
        password: Annotated[str, Form(max_length=200)],
        csrf: Annotated[str | None, Form(max_length=100)] = None,
        next: Annotated[str, Form(max_length=2000)] = "/",
    ):
        guard.check_form(request, csrf)
        back = pages.local_path(next)
        try:
            token = await app.state.sign_in(request, username, password)
        except Throttled as error:
            html = pages.login(None, guard.csrf_token(request), back, error.retry_after)
            response = _page(request, html, 429)
            response.headers.update(error.headers)
            return response
        if token is None:
            return RedirectResponse(pages.login_url(back, error=True), status_code=303)
        response = RedirectResponse(back, status_code=303)
        guard.set_cookie(request, response, COOKIE, token)
        return response

    @app.post("/logout")
    def logout(request: Request, csrf: Annotated[str | None, Form(max_length=100)] = None):
        guard.check_form(request, csrf)
        if token := request.cookies.get(COOKIE):
            acc.sign_out(access.engine, token)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response


def _plain_path(path: str) -> bool:
    """A relative path of ordinary names: no '..', no absolute path, no control characters or backslashes."""
    parts = path.split("/")
    return path.isprintable() and "\\" not in path and all(part not in ("", ".", "..") for part in parts)


class SignIn:
    """Sign-in behind the throttle, its password check on the hashing pool (never the shared one)."""

    def __init__(self, engine: Engine, throttle: SignInThrottle, hashing: HashingPool):
        self.engine, self.throttle, self.hashing = engine, throttle, hashing

    async def __call__(self, request: Request, username: str, password: str) -> str | None:
        address = request.client.host if request.client else "unknown"
        if (wait := self.throttle.begin(username, address)) is not None:
            raise Throttled(wait)
        token = await self.hashing.run(acc.sign_in, self.engine, username, password)
        if token is not None:
            self.throttle.succeeded(username, address)
        return token
