"""Bearer tokens: the token file, who a request is, and what it may read.

The operator keeps one token file per deployment (``databus token add``); every
server (relay, bootstrap, later ones) reads it at start and again on SIGHUP.
It is JSON Lines, one grant per line::

    {"name": "etl", "hash": "$argon2id$v=19$...", "tables": ["shop\\\\..*"], "admin": false}

* ``name``: who holds the token (letters, digits, ``_``, ``-``);
* ``hash``: the argon2id hash of the token (argon2-cffi); the token itself is
  printed once by ``databus token add`` and stored nowhere;
* ``tables``: regexes a table name must match in full (``db.table`` for MySQL, the
  table name for SQLite); empty means none;
* ``admin``: may use the endpoints that change state (``/signal``) or show the
  server's internals (``/admin``).

A token reads ``NAME.SECRET``: the name picks the line, so a request costs at
most one hash verification, and a verified token is remembered (by its SHA-256)
until the file is read again. Verifications run one at a time, so a flood of
wrong tokens costs one argon2 computation's memory, not one per connection.

Contract: :meth:`Authenticator.authenticate` returns a :class:`Principal` or raises
:class:`~databus.core.errors.UnauthorizedError` (401: no token, unknown name, wrong
secret); what a principal may do is asked of the principal
(:meth:`Principal.may_read`, ``admin``); refusing is the endpoint's job
(:class:`~databus.core.errors.ForbiddenError`, 403).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from databus.core.atomic import write_atomic
from databus.core.errors import ConfigError, ForbiddenError, UnauthorizedError

log = logging.getLogger("databus.auth")

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# tokens carry 256 random bits, so the hash need not slow down guessing; these are
# OWASP's minimum argon2id settings, which keep one verification at ~19 MiB
_HASHER = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


@dataclass(frozen=True)
class Grant:
    """One line of the token file."""

    name: str
    hash: str
    tables: tuple[str, ...] = ()
    admin: bool = False

    def to_line(self) -> str:
        return json.dumps({"name": self.name, "hash": self.hash, "tables": list(self.tables),
                           "admin": self.admin})


@dataclass(frozen=True)
class Principal:
    """Who a request is: a token's name and rights."""

    name: str
    admin: bool
    patterns: tuple[re.Pattern[str], ...] = field(default=(), repr=False)
    everything: bool = False

    def may_read(self, table: str) -> bool:
        """Whether this principal may read ``table`` (a source's name)."""
        return self.everything or any(p.fullmatch(table) for p in self.patterns)

    def check_read(self, tables: Iterable[str]) -> None:
        """Raise 403 naming the first of ``tables`` this principal may not read."""
        for t in tables:
            if not self.may_read(t):
                raise ForbiddenError(f"token {self.name!r} may not read {t}")

    def check_admin(self, what: str) -> None:
        """Raise 403 unless this principal has the admin flag."""
        if not self.admin:
            raise ForbiddenError(f"{what} needs an admin token; {self.name!r} is not one")


ANONYMOUS = Principal("anonymous", admin=True, everything=True)
"""Every request's principal when a server runs without a token file (loopback only,
or ``--insecure``)."""


def new_token(name: str) -> str:
    """A fresh token for ``name``: ``NAME.SECRET`` with 256 random bits."""
    if not NAME_RE.match(name):
        raise ConfigError(f"token name {name!r}: use 1-64 letters, digits, '_' or '-'")
    return f"{name}.{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    """The argon2id hash stored in the token file."""
    return _HASHER.hash(token)


def read_grants(path: Path) -> dict[str, Grant]:
    """The grants of a token file by name; every problem a one-line ConfigError naming
    the file and line (a server with a broken token file refuses to start)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {os.strerror(exc.errno or 0) or exc}"
                          ) from exc
    grants: dict[str, Grant] = {}
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"token file {path} line {no}"
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON: {exc}") from exc
        if not isinstance(raw, dict) or set(raw) - {"name", "hash", "tables", "admin"}:
            raise ConfigError(f"{where}: expected an object with name, hash, tables, admin")
        name, hashed = raw.get("name"), raw.get("hash")
        tables, admin = raw.get("tables", []), raw.get("admin", False)
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigError(f"{where}: bad name {name!r}")
        if not isinstance(hashed, str) or not hashed.startswith("$argon2"):
            raise ConfigError(f"{where}: hash must be an argon2 hash")
        if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
            raise ConfigError(f"{where}: tables must be a list of regexes")
        _check_regexes(tables, f"{where}: ")
        if not isinstance(admin, bool):
            raise ConfigError(f"{where}: admin must be true or false")
        if name in grants:
            raise ConfigError(f"{where}: name {name!r} appears twice")
        grants[name] = Grant(name, hashed, tuple(tables), admin)
    return grants


def _check_regexes(tables: Iterable[str], where: str) -> None:
    """Each grant pattern compiles, or a :class:`ConfigError` naming it (after ``where``)."""
    for t in tables:
        try:
            re.compile(t)
        except re.error as exc:
            raise ConfigError(f"{where}bad table regex {t!r}: {exc}") from exc


def write_grants(path: Path, grants: Iterable[Grant]) -> None:
    """Replace the token file atomically (mode 0600)."""
    text = "".join(g.to_line() + "\n" for g in grants)
    write_atomic(path, text.encode("utf-8"))


def add_token(path: Path, name: str, tables: Sequence[str], *, admin: bool = False,
              replace: bool = False) -> str:
    """Add a grant for ``name`` to the token file (created if missing) and return its
    token, which is stored nowhere. An existing name is an error unless ``replace``
    (rotation: the old token stops working at the servers' next SIGHUP)."""
    grants = read_grants(path) if path.exists() else {}
    if name in grants and not replace:
        raise ConfigError(f"token {name!r} exists in {path}; --replace rotates it")
    _check_regexes(tables, "")
    token = new_token(name)
    grants[name] = Grant(name, hash_token(token), tuple(tables), admin)
    write_grants(path, grants.values())
    return token


def remove_token(path: Path, name: str) -> None:
    """Revoke ``name`` (servers stop accepting it at their next SIGHUP)."""
    grants = read_grants(path)
    if grants.pop(name, None) is None:
        raise ConfigError(f"no token {name!r} in {path}")
    write_grants(path, grants.values())


class Authenticator:
    """Checks ``Authorization: Bearer`` headers against a token file (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._grants = read_grants(path)
        self._verified: dict[bytes, Principal] = {}
        self._lock = threading.Lock()  # guards _grants/_verified swaps
        self._hashing = threading.Lock()  # one argon2 verification at a time

    def reload(self) -> None:
        """Read the token file again (SIGHUP). A file that no longer parses keeps the
        grants in force and logs why, so a typo does not lock everyone out."""
        try:
            grants = read_grants(self.path)
        except ConfigError as exc:
            log.error("token file not reloaded, the previous grants stay in force: %s", exc)
            return
        with self._lock:
            self._grants = grants
            self._verified = {}
        log.info("token file %s reloaded: %d token(s)", self.path, len(grants))

    def __len__(self) -> int:
        return len(self._grants)

    def cached(self, authorization: str | None) -> Principal | None:
        """The principal of a header verified before (no hashing), else None."""
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        digest = hashlib.sha256(authorization[7:].strip().encode("utf-8", "surrogatepass"))
        with self._lock:
            return self._verified.get(digest.digest())

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value, or UnauthorizedError."""
        if not authorization:
            raise UnauthorizedError("this server needs a token: Authorization: Bearer ...")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise UnauthorizedError("use Authorization: Bearer <token>")
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            known = self._verified.get(digest)
            grants = self._grants
        if known is not None:
            return known
        name = token.partition(".")[0]
        grant = grants.get(name)
        if grant is None:
            raise UnauthorizedError("unknown token")
        with self._hashing:
            try:
                _HASHER.verify(grant.hash, token)
            except (VerifyMismatchError, VerificationError, InvalidHashError):
                raise UnauthorizedError("unknown token") from None
        principal = Principal(grant.name, grant.admin,
                              tuple(re.compile(t) for t in grant.tables))
        with self._lock:
            if self._grants is grants:  # not reloaded meanwhile
                self._verified[digest] = principal
        return principal
