"""Accounts with scrypt-hashed passwords, and sign-in sessions (random tokens, stored hashed)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from ground_truth.db import accounts, sessions
from ground_truth.schema import Role

SESSION_HOURS = 12
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}  # about 16 MiB and 50 ms per hash: slow for guessers, fine to sign in


@dataclass(frozen=True)
class Account:
    id: int
    username: str
    role: Role


class AccountExists(ValueError):
    pass


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, dklen=32, **_SCRYPT)
    return f"scrypt${_SCRYPT['n']}${_SCRYPT['r']}${_SCRYPT['p']}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    scheme, n, r, p, salt, digest = stored.split("$")
    if scheme != "scrypt":
        return False
    candidate = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), dklen=32)
    return hmac.compare_digest(candidate.hex(), digest)


def create_account(engine: Engine, username: str, password: str, role: Role) -> Account:
    if not 1 <= len(username) <= 64 or not username.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError("username must be 1-64 letters, digits, '.', '_' or '-'")
    if len(password) < 8:
        raise ValueError("password must be at least 8 characters")
    try:
        with engine.begin() as conn:
            inserted = conn.execute(
                insert(accounts).values(
                    username=username,
                    password_hash=hash_password(password),
                    role=Role(role).value,
                    created_at=datetime.now(UTC),
                )
            ).inserted_primary_key
            if inserted is None:  # an INSERT of one row always has its key; the type covers every statement
                raise RuntimeError(f"the account {username!r} was inserted without a key")
            account_id = inserted[0]
    except IntegrityError as error:
        raise AccountExists(f"account {username!r} exists") from error
    return Account(account_id, username, Role(role))


@cache
def _unknown_user_hash() -> str:
    """What an unknown username's password is checked against: the same work as for a real account, so
    the answer's timing does not tell which accounts exist."""
    return hash_password(secrets.token_urlsafe(16))


def sign_in(engine: Engine, username: str, password: str) -> str | None:
    """A new session token, or None for a wrong username or password."""
    with engine.begin() as conn:
        row = conn.execute(select(accounts).where(accounts.c.username == username)).first()
    if row is None:
        verify_password(password, _unknown_user_hash())
        return None
    if not verify_password(password, row.password_hash):
        return None
    token = secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            insert(sessions).values(
                token_hash=_token_hash(token),
                account_id=row.id,
                expires_at=datetime.now(UTC) + timedelta(hours=SESSION_HOURS),
            )
        )
    return token


def account_for(engine: Engine, token: str) -> Account | None:
    with engine.begin() as conn:
        row = conn.execute(
            select(accounts, sessions.c.expires_at).join(sessions).where(sessions.c.token_hash == _token_hash(token))
        ).first()
    if row is None or _aware(row.expires_at) < datetime.now(UTC):
        return None
    return Account(row.id, row.username, Role(row.role))


def sign_out(engine: Engine, token: str) -> None:
    with engine.begin() as conn:
        conn.execute(delete(sessions).where(sessions.c.token_hash == _token_hash(token)))


def list_accounts(engine: Engine) -> list[Account]:
    with engine.begin() as conn:
        rows = conn.execute(select(accounts).order_by(accounts.c.id)).all()
    return [Account(r.id, r.username, Role(r.role)) for r in rows]


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; they were written in UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
