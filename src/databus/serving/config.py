"""The settings of a server's HTTP listener: the ``http:`` section of the relay's and
the bootstrap server's configuration, and the TLS of every server (the binlog service
uses :class:`TlsServerConfig` for its MySQL port).

Contract: models only, frozen and refusing unknown fields
(:class:`~databus.core.config.FrozenModel`); each field's description is the one the
docs and the CLI show. :meth:`TlsServerConfig.server_context` is the only place their
files are read: a file that cannot be read, or a certificate and key that do not go
together, is a :class:`~databus.core.errors.ConfigError` naming the file(s). The
settings are applied by :class:`~databus.serving.service.HttpService` (listener, TLS,
tokens, connection limits and timeouts) and :class:`~databus.serving.guard.Guard`
(body, header and slow-client limits).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import Field

from databus.core.config import FrozenModel
from databus.core.errors import ConfigError


class TlsServerConfig(FrozenModel):
    """TLS of a server: its certificate chain and key (PEM); with ``client_ca_file``,
    mutual TLS: every client must present a certificate that CA signed."""

    cert_file: Path = Field(description="PEM certificate (chain) the server presents")
    key_file: Path = Field(description="PEM private key of that certificate")
    client_ca_file: Path | None = Field(
        None, description="mutual TLS: PEM CA(s) client certificates must chain to")

    def server_context(self) -> ssl.SSLContext:
        """A server TLS context of these files (TLS 1.2 at least; with ``client_ca_file``,
        a client certificate required). A file that cannot be read is a ConfigError
        naming that file and what it is; a certificate and key that do not go together
        are named both."""
        for path, what in ((self.cert_file, "certificate"), (self.key_file, "private key"),
                           (self.client_ca_file, "client CA")):
            if path is None:
                continue
            try:
                with path.open("rb"):
                    pass
            except OSError as exc:
                raise ConfigError(f"TLS {what} file {path}: {exc.strerror or exc}") from exc
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        except ssl.SSLError as exc:
            raise ConfigError(f"TLS certificate {self.cert_file} and key {self.key_file}"
                              f" unusable together: {exc.reason or exc}") from exc
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(str(self.client_ca_file))
            except ssl.SSLError as exc:
                raise ConfigError(f"TLS client CA file {self.client_ca_file} unusable:"
                                  f" {exc.reason or exc}") from exc
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


class HttpServerConfig(FrozenModel):
    """Where and how a server listens (the ``http:`` section of each server's config)."""

    host: str = Field("127.0.0.1", description="address to bind; beyond loopback needs a"
                      " token_file (or insecure)")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    token_file: Path | None = Field(
        None, description="bearer tokens (databus token add); None = no authentication")
    insecure: bool = Field(
        False, description="serve beyond loopback without tokens (warned at every start)")
    tls: TlsServerConfig | None = Field(None, description="serve https (none: plain http)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body")
    max_header_bytes: int = Field(16 * 1024, ge=1024, le=1 << 20,
                                  description="largest request line plus headers")
    max_connections: int = Field(
        2048, ge=1, description="connections (and requests) served at once; more get 503")
    idle_timeout: float = Field(
        15.0, gt=0, le=3600, description="seconds an idle keep-alive connection stays open")
    send_timeout: float = Field(
        60.0, gt=0, le=3600, description="seconds one response part may wait for a client"
        " that does not read; then the connection is cut (the client resumes from its"
        " checkpoint)")
    read_timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds a client may take to send a request"
        " line and headers (from its connection, or the end of its previous answer), and"
        " then its whole body; a client that stalls or trickles is cut (408 for a body)")
