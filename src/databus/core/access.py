"""How a component reaches a relay: one model, the same field names everywhere.

Everything that reads a relay over HTTP (the client library, ``tail``, ``replicate``,
``publish``, the binlog service, the bootstrap producer, a chain relay, a cluster
member following its leader, the Spark readers) describes the relay with
:class:`RelayAccess` (or, where the address is found another way, its credentials
part :class:`RelayCredentials`):

==============  ==============================================================
``url``         a relay URL (``http(s)://HOST:PORT``), a comma-separated list of
                relays, or a relay cluster's address ``zk://HOST:PORT[,...]/NAME``
``token``       the bearer token itself (Python callers; files prefer ``token_file``)
``token_file``  a file whose first line is the token, read at each connect
``ca_file``     PEM CA(s) the relay's TLS certificate must chain to
``cert_file``   client certificate (chain) for mutual TLS
``key_file``    its private key
==============  ==============================================================

What is not given comes from the environment when the connection is made
(``DATABUS_TOKEN``, ``DATABUS_TOKEN_FILE``, ``DATABUS_CA_FILE``,
``DATABUS_CERT_FILE``, ``DATABUS_KEY_FILE``: :mod:`databus.client.credentials`).
A relay's certificate is always verified; there is no setting to turn that off.
The Spark readers take the same names in camelCase (``tokenFile``, ``caFile``,
``certFile``, ``keyFile``).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from databus.core.config import FrozenModel

ZK_ADDRESS = re.compile(r"^zk://(?P<hosts>[^/\s]+)/(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)/?$")
"""A relay cluster's address (:class:`databus.coord.address.ZkAddress` parses it)."""


def check_relay_spec(spec: str) -> str:
    """``spec`` normalised when it names relays: an ``http(s)://`` URL, a comma-separated
    list of them (trailing slashes dropped), or a cluster address ``zk://HOST:PORT/NAME``;
    else ValueError saying what is accepted."""
    spec = spec.strip()
    if spec.startswith("zk://"):
        if not ZK_ADDRESS.match(spec):
            raise ValueError(f"bad relay cluster address {spec!r}: zk://HOST:PORT[,HOST:PORT"
                             "...]/NAME")
        return spec
    urls = [u.strip().rstrip("/") for u in spec.split(",")]
    if not all(u.startswith(("http://", "https://")) and u.partition("://")[2] for u in urls):
        raise ValueError("a relay is an http:// or https:// URL, a comma-separated list of"
                         " them, or a cluster address zk://HOST:PORT/NAME")
    return ",".join(urls)


class RelayCredentials(FrozenModel):
    """What a client presents to a relay (see the module docstring)."""

    token: SecretStr | None = Field(
        None, description="bearer token (prefer token_file or DATABUS_TOKEN: a token in a"
        " config file or on a command line is readable by others)")
    token_file: Path | None = Field(
        None, description="file whose first line is the bearer token (default:"
        " DATABUS_TOKEN / DATABUS_TOKEN_FILE)")
    ca_file: Path | None = Field(
        None, description="PEM CA(s) the relay's TLS certificate must chain to (default:"
        " DATABUS_CA_FILE, else the system's)")
    cert_file: Path | None = Field(
        None, description="client certificate for mutual TLS (default: DATABUS_CERT_FILE)")
    key_file: Path | None = Field(
        None, description="the client certificate's private key (default:"
        " DATABUS_KEY_FILE)")

    @model_validator(mode="after")
    def _pair(self) -> RelayCredentials:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = (("cert_file", "key_file") if self.key_file is None
                              else ("key_file", "cert_file"))
            raise ValueError(f"{given} needs {missing} too (a client certificate and its key"
                             " go together)")
        if self.token is not None and self.token_file is not None:
            raise ValueError("give token or token_file, not both")
        return self

    def credential_fields(self) -> dict[str, Any]:
        """The credential fields as keyword arguments of
        :meth:`databus.client.credentials.Credentials.from_env`."""
        return {"token": self.token.get_secret_value() if self.token is not None else None,
                "token_file": self.token_file, "ca_file": self.ca_file,
                "cert_file": self.cert_file, "key_file": self.key_file}


class RelayAccess(RelayCredentials):
    """Where a relay is, and what to present to it. A plain string is its ``url``."""

    url: str = Field(description="relay URL (http(s)://HOST:PORT), a comma-separated list of"
                     " relays, or a relay cluster's address zk://HOST:PORT/NAME")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"url": v} if isinstance(v, str) else v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_relay_spec(v)


def fold_relay_fields(raw: Any, names: dict[str, str], where: str) -> Any:
    """``raw`` (a config mapping) with older, flat spellings of its relay settings (the
    keys of ``names``, e.g. ``relay_url``, ``tls_ca_file``) moved into its ``relay``
    section under their :class:`RelayAccess` names (the values of ``names``), with a
    DeprecationWarning naming the new spelling. Giving both spellings is an error."""
    if not isinstance(raw, dict) or not any(k in raw for k in names):
        return raw
    out = dict(raw)
    relay = out.get("relay")
    section: dict[str, Any] = ({"url": relay} if isinstance(relay, str)
                               else dict(relay) if isinstance(relay, dict)
                               else {} if relay is None else {"url": relay})
    if isinstance(relay, RelayAccess):
        section = relay.model_dump(exclude_unset=True)
    for old, new in names.items():
        if old not in out:
            continue
        if new in section:
            raise ValueError(f"{old} and relay.{new} both given: give relay.{new} only")
        section[new] = out.pop(old)
        warnings.warn(f"{where}: {old} is deprecated, use relay.{new} (the relay settings"
                      " are one section: url, token, token_file, ca_file, cert_file,"
                      " key_file)", DeprecationWarning, stacklevel=6)
    out["relay"] = section
    return out


CLIENT_LEGACY_NAMES = {"relay_url": "url", "token": "token", "token_file": "token_file",
                       "tls_ca_file": "ca_file", "tls_cert_file": "cert_file",
                       "tls_key_file": "key_file"}
"""The client's (and the publisher's) relay settings before :class:`RelayAccess`."""
