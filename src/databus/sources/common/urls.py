"""The URL of a database server source, read one way for every kind.

``SCHEME://USER[:PASS]@HOST[:PORT][/PATH]`` with URL-encoded user, password and path:
a scheme of another kind, a missing host or a port that is not a number is a
:class:`~databus.core.errors.ConfigError` naming the URL with its password hidden;
a password given apart (a password file) replaces the URL's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from databus.core.errors import ConfigError
from databus.core.redact import redact_url


@dataclass(frozen=True)
class ServerUrl:
    """The parts of a server URL; ``repr`` never shows the password."""

    host: str
    port: int
    user: str
    password: str = field(default="", repr=False)
    path: str = ""  # unquoted, without its leading slash


def parse_server_url(url: str, *, kind: str, schemes: tuple[str, ...], port: int,
                     user: str, password: str | None = None) -> ServerUrl:
    """The parts of ``url`` (module docstring); ``kind`` names it in errors (``mysql``),
    ``port`` and ``user`` are the defaults."""
    u = urlparse(url)
    if u.scheme not in schemes:
        raise ConfigError(f"not a {kind}:// URL: {redact_url(url)!r}")
    if not u.hostname:
        raise ConfigError(f"{kind} URL needs a host: {redact_url(url)!r}")
    try:
        number = u.port or port
    except ValueError:
        raise ConfigError(f"bad port in {kind} URL {redact_url(url)!r}") from None
    pw = password if password is not None else unquote(u.password or "")
    return ServerUrl(u.hostname, number, unquote(u.username or user), pw,
                     unquote(u.path.lstrip("/")))
