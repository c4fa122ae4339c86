"""The model server's named keys, created, rotated and revoked with `mlplane models keys`: a JSON file
holding each key's name, role (`admin` or `data`) and the SHA-256 digest of its secret, never the
secret. The server re-reads the file when it changes, so a rotation or a revocation holds from the
next request without a restart."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROLES = ("admin", "data")
SECRET_PREFIX = "mlms-"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


@dataclass(frozen=True)
class NamedKey:
    name: str
    role: str
    key_hash: str  # hex SHA-256 of the secret
    created_at: float
    rotated_at: float | None = None
    revoked_at: float | None = None

    def public(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "key_hash"}


class KeyFile:
    """Reads (for the server) and edits (for the CLI) one key file. Edits hold an exclusive lock on a
    sibling lock file and replace the file whole, so a reader never sees half a file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) of the file last read
        self._digests: dict[str, list[bytes]] = {role: [] for role in ROLES}

    # the server's side
    def digests(self, role: str) -> list[bytes]:
        """The digests of the active keys of `role`, re-read when the file has changed."""
        try:
            stat = self.path.stat()
            seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # each edit is a new inode
        except FileNotFoundError:
            seen = None
        if seen != self._seen:
            active = [k for k in self.read() if k.revoked_at is None] if seen else []
            self._digests = {r: [bytes.fromhex(k.key_hash) for k in active if k.role == r] for r in ROLES}
            self._seen = seen
        return self._digests[role]

    def matches(self, secret: bytes, roles: tuple[str, ...]) -> bool:
        """Whether `secret` is an active key of one of `roles`; every digest is compared in constant time."""
        given = digest(secret)
        found = False
        for role in roles:
            for known in self.digests(role):
                found |= hmac.compare_digest(given, known)
        return found

    # the CLI's side
    def read(self) -> list[NamedKey]:
        if not self.path.exists():
            return []
        return [NamedKey(**entry) for entry in json.loads(self.path.read_text())["keys"]]

    def create(self, name: str, role: str) -> tuple[str, NamedKey]:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        if not NAME.fullmatch(name):
            raise ValueError(f"a key name is 1 to 64 letters, digits, '_', '.' or '-', not {name!r}")
        with self._editing() as keys:
            if any(k.name == name for k in keys):
                raise ValueError(f"a key named {name!r} exists: rotate or revoke it")
            secret = _new_secret(name)
            key = NamedKey(name, role, digest(secret.encode()).hex(), time.time())
            keys.append(key)
        return secret, key

    def rotate(self, name: str) -> tuple[str, NamedKey]:
        """A new secret for the key; the old one stops working."""
        secret = _new_secret(name)
        key = self._replace(name, key_hash=digest(secret.encode()).hex(), rotated_at=time.time(), revoked_at=None)
        return secret, key

    def revoke(self, name: str) -> NamedKey:
        return self._replace(name, revoked_at=time.time())

    def _replace(self, name: str, **changes) -> NamedKey:
        with self._editing() as keys:
            for i, key in enumerate(keys):
                if key.name == name:
                    keys[i] = NamedKey(**{**asdict(key), **changes})
                    return keys[i]
        raise KeyError(f"no key named {name!r} in {self.path}")

    @contextlib.contextmanager
    def _editing(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            keys = self.read()
            yield keys
            staged = self.path.with_suffix(".tmp")
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # digests only, still private
            with os.fdopen(fd, "w") as out:
                json.dump({"keys": [asdict(k) for k in keys]}, out, indent=1)
            os.replace(staged, self.path)


def _new_secret(name: str) -> str:
    return f"{SECRET_PREFIX}{name}-{secrets.token_urlsafe(32)}"
