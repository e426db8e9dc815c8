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
"""

from __future__ import annotations

import os
import ssl
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
        """A verifying TLS context with this CA and client certificate."""
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
