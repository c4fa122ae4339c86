"""The labeling web app: a JSON API (used by the pages' script, the simulated annotators and the
benchmark) and server-rendered pages. Every route names the roles it admits; others get 403."""

from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool

from ground_truth import accounts as acc
from ground_truth import pages, review
from ground_truth import queue as q
from ground_truth.db import connect
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


def create_app(database_url: str, media_root: Path | None = None, throttle: SignInThrottle | None = None) -> FastAPI:
    engine = connect(database_url)
    app = FastAPI(title="mlplane labeling", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    app.state.sign_in = SignIn(engine, throttle or SignInThrottle(), HashingPool())
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _errors(app)

    def signed_in(request: Request) -> acc.Account:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else request.cookies.get(COOKIE)
        account = acc.account_for(engine, token) if token else None
        if account is None:
            raise HTTPException(401, "sign in first (POST /api/login or the /login page)")
        return account

    # the role check and the task lookup are async: pure or cached, they need no threadpool hop (each
    # sync dependency is one, and under 20 annotators the hops were a part of every round trip)
    def require(*roles: Role):
        async def check(account: Annotated[acc.Account, Depends(signed_in)]) -> acc.Account:
            if account.role not in roles:
                raise HTTPException(
                    403, f"a {account.role.value} may not do this (needs {' or '.join(r.value for r in roles)})"
                )
            return account

        return check

    known_tasks: dict[str, q.Task] = {}

    async def task_named(task: str) -> q.Task:
        # a task's spec never changes (create_task refuses another spec) and tasks are not deleted, so
        # one read per task and process; an unknown name is read again each time (another process may add it)
        if task not in known_tasks:
            known_tasks[task] = await run_in_threadpool(q.get_task, engine, task)
        return known_tasks[task]

    Annotator = Annotated[acc.Account, Depends(require(*ANNOTATOR))]
    Reviewer = Annotated[acc.Account, Depends(require(*REVIEWERS))]
    Admin = Annotated[acc.Account, Depends(require(*ADMIN))]
    Anyone = Annotated[acc.Account, Depends(signed_in)]
    TaskDep = Annotated[q.Task, Depends(task_named)]

    @app.post("/api/login")
    async def api_login(request: Request, body: Credentials) -> dict:
        token = await app.state.sign_in(request, body.username, body.password)
        if token is None:
            raise HTTPException(401, "wrong username or password")
        response = JSONResponse({"token": token})
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.get("/api/tasks")
    def api_tasks(account: Anyone) -> list[TaskSpec]:
        return [t.spec for t in q.list_tasks(engine)]

    @app.get("/api/tasks/{task}/next")
    def api_next(account: Annotator, task: TaskDep) -> Next:
        return Next(item=q.serve(engine, task, account.id))

    def following(task: q.Task, account: acc.Account) -> Next:
        try:
            return Next(item=q.serve(engine, task, account.id))
        except q.Busy:
            return Next(item=None, retry=True)

    @app.post("/api/tasks/{task}/answers")
    def api_answer(body: Answer, account: Annotator, task: TaskDep) -> Next:
        item, retry = q.answer_and_serve(engine, task, account.id, body.item_id, body.label)
        return Next(item=item, retry=retry)

    @app.post("/api/tasks/{task}/skip")
    def api_skip(body: ItemRef, account: Annotator, task: TaskDep) -> Next:
        q.skip(engine, task, account.id, body.item_id)
        return following(task, account)

    @app.post("/api/tasks/{task}/undo")
    def api_undo(account: Annotator, task: TaskDep) -> Next:
        return Next(item=q.undo(engine, task, account.id))

    @app.get("/api/tasks/{task}/disputes")
    def api_disputes(account: Reviewer, task: TaskDep) -> list[dict]:
        return [pages.dispute_json(s) for s in review.disputes(engine, task)]

    @app.post("/api/tasks/{task}/verdicts")
    def api_verdict(body: Answer, account: Reviewer, task: TaskDep) -> dict:
        review.adjudicate(engine, task, account.id, body.item_id, body.label)
        return {"item_id": body.item_id, "verdict": body.label}

    @app.get("/api/tasks/{task}/quality")
    def api_quality(account: Reviewer, task: TaskDep) -> dict:
        return pages.quality_json(review.task_quality(engine, task))

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

    _pages(app, engine, signed_in, media_root)
    return app


def _pages(app: FastAPI, engine: Engine, signed_in, media_root: Path | None) -> None:
    def page_account(request: Request, roles: tuple[Role, ...] | None = None) -> acc.Account:
        try:
            account = signed_in(request)
        except HTTPException as error:
            raise HTTPException(303, headers={"location": "/login"}) from error
        if roles is not None and account.role not in roles:
            raise HTTPException(403, f"a {account.role.value} may not open this page")
        return account

    @app.get("/login", response_class=HTMLResponse)
    def login_page(error: str | None = None) -> str:
        return pages.login(error)

    @app.post("/login")
    async def login_form(
        request: Request,
        username: Annotated[str, Form(max_length=64)],
        password: Annotated[str, Form(max_length=200)],
    ):
        try:
            token = await app.state.sign_in(request, username, password)
        except Throttled as error:
            return HTMLResponse(pages.login(None, error.retry_after), 429, headers=error.headers)
        if token is None:
            return RedirectResponse("/login?error=1", status_code=303)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.post("/logout")
    def logout(request: Request):
        if token := request.cookies.get(COOKIE):
            acc.sign_out(engine, token)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request) -> str:
        return pages.home(page_account(request), q.list_tasks(engine))

    @app.get("/label/{task}", response_class=HTMLResponse)
    def label_page(request: Request, task: str) -> str:
        return pages.label(page_account(request, ANNOTATOR), q.get_task(engine, task))

    @app.get("/review/{task}", response_class=HTMLResponse)
    def review_page(request: Request, task: str) -> str:
        account = page_account(request, REVIEWERS)  # before the lookup: a stranger learns no task names
        found = q.get_task(engine, task)
        return pages.review(account, found, review.disputes(engine, found), review.task_quality(engine, found))

    @app.get("/admin", response_class=HTMLResponse)
    def admin_page(request: Request) -> str:
        return pages.admin(page_account(request, ADMIN), acc.list_accounts(engine), q.list_tasks(engine))

    @app.get("/media/{path:path}")
    def media(request: Request, path: str):
        page_account(request)
        # only a file an item shows, never the rest of the media root (users, reports, chat messages)
        if media_root is None or not _plain_path(path) or not q.shows_media(engine, path):
            raise HTTPException(404, f"no media file {path!r}")
        root = media_root.resolve()
        file = (root / path).resolve()
        if not file.is_relative_to(root) or not file.is_file():
            raise HTTPException(404, f"no media file {path!r}")
        return FileResponse(file)


def _plain_path(path: str) -> bool:
    """A relative path of ordinary names: no '..', no absolute path, no control characters or backslashes."""
    parts = path.split("/")
    return path.isprintable() and "\\" not in path and all(part not in ("", ".", "..") for part in parts)


class Throttled(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"too many sign-in attempts for this account or address: try again in {retry_after} s")
        self.retry_after = retry_after
        self.headers = {"retry-after": str(retry_after)}


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


def _errors(app: FastAPI) -> None:
    @app.exception_handler(Throttled)
    def throttled(_request, error):
        return JSONResponse({"detail": str(error)}, status_code=429, headers=error.headers)

    @app.exception_handler(q.NotFound)
    def not_found(_request, error):
        return JSONResponse({"detail": str(error)}, status_code=404)

    @app.exception_handler(q.Conflict)
    def conflict(_request, error):
        return JSONResponse({"detail": str(error)}, status_code=409)

    @app.exception_handler(acc.AccountExists)
    def exists(_request, error):
        return JSONResponse({"detail": str(error)}, status_code=409)

    @app.exception_handler(ValueError)
    def invalid(_request, error):
        return JSONResponse({"detail": str(error)}, status_code=422)

    @app.exception_handler(q.Busy)
    def busy(_request, error):
        return JSONResponse({"detail": str(error)}, status_code=503, headers={"retry-after": "1"})

    @app.exception_handler(OperationalError)
    def unavailable(_request, error):
        return JSONResponse({"detail": f"the label database is unavailable: {error.orig}"}, status_code=503)
