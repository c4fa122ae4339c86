"""Keys and usage records in SQL: SQLite by default, PostgreSQL in the prod profile (one code path,
SQLAlchemy Core). Keys are stored as SHA-256 digests of high-entropy secrets, never in plaintext."""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sqlalchemy as sa

KEY_PREFIX = "sk-mlp-"

metadata = sa.MetaData()
keys_table = sa.Table(
    "gateway_keys",
    metadata,
    sa.Column("key_id", sa.String(32), primary_key=True),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("team", sa.String(200), nullable=False),
    sa.Column("models", sa.Text, nullable=False),  # JSON list; empty means every model
    sa.Column("rpm", sa.Integer),
    sa.Column("tpm", sa.Integer),
    sa.Column("rpd", sa.Integer),
    sa.Column("tpd", sa.Integer),
    sa.Column("expires_at", sa.Float),
    sa.Column("revoked_at", sa.Float),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("rotated_at", sa.Float),
)
usage_table = sa.Table(
    "gateway_usage",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("request_id", sa.String(64), nullable=False, unique=True),
    sa.Column("ts", sa.Float, nullable=False, index=True),
    sa.Column("key_id", sa.String(32), index=True),
    sa.Column("team", sa.String(200)),
    sa.Column("model", sa.String(200)),
    sa.Column("backend", sa.String(500)),
    sa.Column("region", sa.String(100)),
    sa.Column("endpoint", sa.String(100)),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
)
USAGE_COLUMNS = [column.name for column in usage_table.columns if column.name != "id"]
# a team's limits bind every key of the team together (a key holds only its own)
teams_table = sa.Table(
    "gateway_teams",
    metadata,
    sa.Column("team", sa.String(200), primary_key=True),
    sa.Column("rpm", sa.Integer),
    sa.Column("tpm", sa.Integer),
    sa.Column("rpd", sa.Integer),
    sa.Column("tpd", sa.Integer),
    sa.Column("updated_at", sa.Float, nullable=False),
)
LIMIT_FIELDS = ("rpm", "tpm", "rpd", "tpd")


@dataclass
class ApiKey:
    key_id: str
    owner: str
    team: str
    models: list[str] = field(default_factory=list)
    rpm: int | None = None
    tpm: int | None = None
    rpd: int | None = None
    tpd: int | None = None
    expires_at: float | None = None
    revoked_at: float | None = None
    created_at: float = 0.0
    rotated_at: float | None = None

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models

    def problem(self, now: float) -> str | None:
        """Why this key cannot be used now, or None."""
        if self.revoked_at is not None:
            return "this API key has been revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "this API key has expired"
        return None

    def public(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Team:
    team: str
    rpm: int | None = None
    tpm: int | None = None
    rpd: int | None = None
    tpd: int | None = None
    updated_at: float = 0.0

    def public(self) -> dict:
        return asdict(self)


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def engine_for(url: str) -> sa.Engine:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _wal(connection, _record):  # readers do not block the usage writer
            connection.execute("PRAGMA journal_mode=WAL")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    elif not url.startswith("postgresql+"):
        raise ValueError(f"gateway store must be sqlite:///PATH or postgresql://..., not {url!r}")
    return sa.create_engine(url, pool_size=5, max_overflow=5, pool_pre_ping=True)


class GatewayStore:
    def __init__(self, url: str):
        self.engine = engine_for(url)
        metadata.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # keys
    def create_key(
        self,
        owner: str,
        team: str,
        models: list[str] | None = None,
        expires_at: float | None = None,
        **limits: int | None,
    ) -> tuple[str, ApiKey]:
        """A new key; returns the plaintext secret (shown once) and its record."""
        unknown = set(limits) - set(LIMIT_FIELDS)
        if unknown:
            raise ValueError(f"unknown limits {sorted(unknown)}; known: {LIMIT_FIELDS}")
        if not owner or not team:
            raise ValueError("a key needs an owner and a team")
        if isinstance(models, str):
            raise ValueError("models must be a list of model names, not one string")
        key_id = secrets.token_hex(6)
        secret = f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(24)}"
        record = ApiKey(
            key_id=key_id,
            owner=owner,
            team=team,
            models=sorted(models or []),
            expires_at=expires_at,
            created_at=time.time(),
            **limits,
        )
        row = {**asdict(record), "models": json.dumps(record.models), "key_hash": hash_key(secret)}
        with self.engine.begin() as conn:
            conn.execute(keys_table.insert().values(**row))
        return secret, record

    def list_keys(self) -> list[ApiKey]:
        with self.engine.connect() as conn:
            rows = conn.execute(keys_table.select().order_by(keys_table.c.created_at)).mappings().all()
        return [_key(row) for row in rows]

    def get_key(self, key_id: str) -> ApiKey:
        with self.engine.connect() as conn:
            row = conn.execute(keys_table.select().where(keys_table.c.key_id == key_id)).mappings().first()
        if row is None:
            raise KeyError(f"no API key with id {key_id!r}")
        return _key(row)

    def lookup(self, secret: str) -> tuple[ApiKey, Team | None] | None:
        """The key of a secret with its team's limits (None when the team has no row), or None."""
        query = (
            sa.select(keys_table, *[teams_table.c[n].label(f"t_{n}") for n in (*LIMIT_FIELDS, "team")])
            .select_from(keys_table.outerjoin(teams_table, keys_table.c.team == teams_table.c.team))
            .where(keys_table.c.key_hash == hash_key(secret))
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            return None
        team = Team(row["team"], *(row[f"t_{n}"] for n in LIMIT_FIELDS)) if row["t_team"] is not None else None
        return _key(row), team

    # teams
    def set_team(self, team: str, **limits: int | None) -> Team:
        """Creates or replaces a team's limits (a limit left out is none)."""
        if not team:
            raise ValueError("a team needs a name")
        record = Team(team, **{n: limits.get(n) for n in LIMIT_FIELDS}, updated_at=time.time())
        with self.engine.begin() as conn:
            updated = conn.execute(teams_table.update().where(teams_table.c.team == team).values(**asdict(record)))
            if updated.rowcount == 0:
                conn.execute(teams_table.insert().values(**asdict(record)))
        return record

    def list_teams(self) -> list[Team]:
        with self.engine.connect() as conn:
            rows = conn.execute(teams_table.select().order_by(teams_table.c.team)).mappings().all()
        return [Team(**row) for row in rows]

    def version(self) -> tuple:
        """Changes whenever a key is created, revoked or rotated or a team's limits change: replicas poll
        it to drop cached keys at once."""
        with self.engine.connect() as conn:
            keys = conn.execute(
                sa.select(sa.func.count(), sa.func.max(keys_table.c.revoked_at), sa.func.max(keys_table.c.rotated_at))
            ).one()
            teams = conn.execute(sa.select(sa.func.count(), sa.func.max(teams_table.c.updated_at))).one()
        return (*keys, *teams)

    def revoke_key(self, key_id: str) -> ApiKey:
        self._update(key_id, revoked_at=time.time())
        return self.get_key(key_id)

    def rotate_key(self, key_id: str) -> tuple[str, ApiKey]:
        """A new secret for the same key id, limits and entitlements; the old secret stops working."""
        record = self.get_key(key_id)
        if record.revoked_at is not None:
            raise ValueError(f"API key {key_id!r} is revoked and cannot be rotated")
        secret = f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(24)}"
        self._update(key_id, key_hash=hash_key(secret), rotated_at=time.time())
        return secret, self.get_key(key_id)

    def _update(self, key_id: str, **values) -> None:
        with self.engine.begin() as conn:
            updated = conn.execute(keys_table.update().where(keys_table.c.key_id == key_id).values(**values))
        if updated.rowcount == 0:
            raise KeyError(f"no API key with id {key_id!r}")

    # usage
    def write_usage(self, records: list[dict], skip_existing: bool = False) -> None:
        """One transaction for a batch. The INSERT is compiled once and its rows go to the driver as
        they are: SQLAlchemy's per-row parameter processing cost more than SQLite itself. With
        `skip_existing` (a replay), records whose request id the store holds are left out."""
        with self.engine.begin() as conn:
            if skip_existing and records:
                ids = [record["request_id"] for record in records]
                held = set(conn.scalars(sa.select(usage_table.c.request_id).where(usage_table.c.request_id.in_(ids))))
                records = [record for record in records if record["request_id"] not in held]
            if records:
                statement, order = self._usage_insert
                rows = [tuple(record[column] for column in order) for record in records] if order else records
                conn.exec_driver_sql(statement, rows)

    @functools.cached_property
    def _usage_insert(self) -> tuple[str, tuple[str, ...] | None]:
        """The dialect's INSERT of a usage record and, for a positional paramstyle, its column order."""
        compiled = usage_table.insert().inline().compile(dialect=self.engine.dialect, column_keys=USAGE_COLUMNS)
        return str(compiled), tuple(compiled.positiontup or ()) if compiled.positional else None

    def usage_report(
        self, since: float = 0.0, until: float | None = None, group_by: tuple[str, ...] = ("key_id", "team", "model")
    ) -> list[dict]:
        allowed = {"key_id", "team", "model", "backend", "region", "status", "endpoint"}
        if not set(group_by) <= allowed:
            raise ValueError(f"group_by must be among {sorted(allowed)}, not {list(group_by)}")
        columns = [usage_table.c[name] for name in group_by]
        query = sa.select(
            *columns,
            sa.func.count().label("requests"),
            sa.func.coalesce(sa.func.sum(usage_table.c.prompt_tokens), 0).label("prompt_tokens"),
            sa.func.coalesce(sa.func.sum(usage_table.c.completion_tokens), 0).label("completion_tokens"),
            sa.func.avg(usage_table.c.latency_ms).label("mean_latency_ms"),
            sa.func.sum(sa.case((usage_table.c.status >= 400, 1), else_=0)).label("errors"),
        ).where(usage_table.c.ts >= since)
        if until is not None:
            query = query.where(usage_table.c.ts < until)
        query = query.group_by(*columns).order_by(*columns)
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]


def _key(row) -> ApiKey:
    values = {name: row[name] for name in ApiKey.__dataclass_fields__}
    values["models"] = json.loads(row["models"])
    return ApiKey(**values)
