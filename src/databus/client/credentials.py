"""What a client presents to a server: a bearer token and TLS settings.

Every client the project ships (the client library, ``tail``, ``replicate``, the
bootstrap client and producer, the Spark source) connects through
:class:`~databus.client.relay.RelayConnection`, which takes a :class:`Credentials`
or, when given none, :meth:`Credentials.from_env`. A token never has to appear on a
command line, where other users of the machine could read it:

* ``DATABUS_TOKEN``: the token itself, or ``DATABUS_TOKEN_FILE``: a file holding
  it (the first line; the file is read at connect time, so a rotated token is
  picked up by the next connection);
* ``DATABUS_CA_FILE``: PEM CA(s) that server certificates must chain to (default:
  the system's); ``DATABUS_CERT_FILE`` and ``DATABUS_KEY_FILE``: the client
  certificate for mutual TLS.

Server certificates are always verified for ``https://`` URLs; there is no switch
to turn that off.

TLS contexts (:meth:`Credentials.ssl_context`) are built once per process for the
same CA, client certificate and key files (loading a CA store costs 20-30 ms of CPU,
and a client opens up to three connections), and only where a connection needs one:
:func:`no_tls_context` is what a connection to ``http://`` URLs only holds instead.
A file replaced or rewritten on disk (another modification time or size) gives a
new context; the token is never part of a context.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from databus.core.errors import ConfigError

TOKEN_ENV = "DATABUS_TOKEN"
TOKEN_FILE_ENV = "DATABUS_TOKEN_FILE"
CA_FILE_ENV = "DATABUS_CA_FILE"
CERT_FILE_ENV = "DATABUS_CERT_FILE"
KEY_FILE_ENV = "DATABUS_KEY_FILE"

# one context per (file, stat) triple: contexts are safe to share between
# connections and threads once configured, and are never changed after this
_TLS: dict[tuple[object, ...], ssl.SSLContext] = {}
_TLS_LOCK = threading.Lock()
_NO_TLS: ssl.SSLContext | None = None


def _stat_key(path: Path | None) -> object:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return (str(path), None)  # unreadable: building the context reports it
    return (str(path), st.st_mtime_ns, st.st_size, st.st_ino)


def no_tls_context() -> ssl.SSLContext:
    """The context of a connection that only reads ``http://`` URLs: it trusts no CA,
    so a TLS handshake through it always fails verification (never an unverified
    connection); built without loading any certificate, once per process."""
    global _NO_TLS
    if _NO_TLS is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, trusts nothing
        _NO_TLS = ctx
    return _NO_TLS


def cert_failure(exc: BaseException) -> str | None:
    """Why a server's certificate did not verify, when that is what ``exc`` (an HTTP
    client's connection error) comes from; None for any other failure."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"{e.reason or 'CERTIFICATE_VERIFY_FAILED'}: {e.verify_message or e}"
        e = e.__cause__ or e.__context__
    return None


def read_secret_file(path: Path, what: str = "token file") -> str:
    """The secret in ``path`` (its first non-empty line); a one-line ConfigError naming
    ``what`` when the file cannot be read or is empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    raise ConfigError(f"{what} {path} is empty")


@dataclass(frozen=True)
class Credentials:
    """A token and TLS files; ``repr`` never shows the token."""

    token: str | None = field(default=None, repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, token: str | None = None,
                 token_file: Path | None = None, ca_file: Path | None = None,
                 cert_file: Path | None = None, key_file: Path | None = None) -> Credentials:
        """Explicit values first, then the environment (see the module docstring)."""
        env = os.environ if env is None else env
        if token is None and token_file is None:
            token = env.get(TOKEN_ENV) or None
            if token is None and env.get(TOKEN_FILE_ENV):
                token_file = Path(env[TOKEN_FILE_ENV])
        if token is None and token_file is not None:
            token = read_secret_file(token_file)

        def path(value: Path | None, name: str) -> Path | None:
            return value if value is not None else (Path(env[name]) if env.get(name) else None)

        creds = cls(token, path(ca_file, CA_FILE_ENV), path(cert_file, CERT_FILE_ENV),
                    path(key_file, KEY_FILE_ENV))
        if (creds.cert_file is None) != (creds.key_file is None):
            raise ConfigError("a client certificate needs both a cert file and a key file")
        return creds

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying TLS context with this CA and client certificate: the same
        object for the same files (unchanged on disk) within a process."""
        key = tuple(_stat_key(f) for f in (self.ca_file, self.cert_file, self.key_file))
        with _TLS_LOCK:
            ctx = _TLS.get(key)
            if ctx is None:
                ctx = _TLS[key] = self._new_ssl_context()
        return ctx

    def _new_ssl_context(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None)
            if self.cert_file is not None and self.key_file is not None:
                ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"client TLS files unusable: {why}"
                              f" ({getattr(exc, 'filename', None) or self.ca_file})") from exc
        return ctx

    def httpx_options(self) -> dict[str, Any]:
        """``headers`` and ``verify`` for an ``httpx.Client``."""
        return {"headers": self.headers(), "verify": self.ssl_context()}
