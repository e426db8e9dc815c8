"""Configuration of the binlog service (``databus binlog-server``), one pydantic model.

Fields (all but ``relay`` have defaults)::

    relay:          the relay: its URL(s) or zk://HOST:PORT/NAME, or the whole
                    relay section (url, token_file, ca_file, cert_file, key_file:
                    databus.core.access.RelayAccess, as every client's)
    tables:         ['db.table', ...] to convert; empty = every table of the relay
    data_dir:       directory of the binlog files, index and position map
    base:           binlog file base name (files <base>.000001 ..., index <base>.index)
    server_id:      the server id in every event header and @@server_id
    rotate_bytes:   a file is closed (Rotate) once it reaches this size
    retention:      seconds a closed file is kept (default 7 days); then purged
    purge_interval: seconds between purge checks
    checkpoint_every: at most this many relay windows per fsync + map update (a backlog)
    flush_delay:    seconds without a new window after which the windows received are
                    written (fsync + map): each relay answer is visible at once
    poll_timeout:   the converter's relay long poll (it wakes at once on new windows;
                    this bounds how long a stop waits)
    require_complete_history: a new binlog refuses to start when the relay cannot prove
                    it holds its source's changes from the beginning (default: start at
                    the relay's oldest window with a warning)
    host, port:     where the MySQL-protocol server listens (default 127.0.0.1:3307)
    user:           the replication user's name
    password_file:  file whose first line is its password (required)
    tls:            server certificate and key (databus.serving.TlsServerConfig)
    heartbeat:      seconds between heartbeats when the client sets none (0 = none)

:meth:`BinlogServiceConfig.client_config` gives the converter's
:class:`~databus.client.ClientConfig`. The CLI builds the pieces as::

    store = BinlogStore(cfg.data_dir, base=cfg.base, server_id=cfg.server_id,
                        rotate_bytes=cfg.rotate_bytes)
    conv = BinlogConverter(cfg.client_config(), store, retention=cfg.retention,
                           checkpoint_every=cfg.checkpoint_every,
                           purge_interval=cfg.purge_interval, flush_delay=cfg.flush_delay,
                           require_complete_history=cfg.require_complete_history)
    threading.Thread(target=conv.run, args=(stop,)).start()
"""

from __future__ import annotations

from pathlib import Path
from socket import gethostname
from typing import Any

from pydantic import Field, model_validator

from databus.client.config import ClientConfig
from databus.core.access import RelayAccess, fold_relay_fields
from databus.core.config import ConfigModel
from databus.serving.config import TlsServerConfig

__all__ = ["BinlogServiceConfig"]

_LEGACY = {"token_file": "token_file", "tls_ca_file": "ca_file", "tls_cert_file": "cert_file",
           "tls_key_file": "key_file"}


class BinlogServiceConfig(ConfigModel):
    """Everything ``databus binlog-server`` needs (see the module docstring)."""

    relay: RelayAccess = Field(description="the relay: URL(s), comma-separated, or"
                               " zk://HOST:PORT/NAME, and its credentials (token_file,"
                               " ca_file, cert_file, key_file)")
    tables: list[str] = Field(default_factory=list,
                              description="tables ('db.table') to convert; empty = all")
    data_dir: Path = Field(Path("binlog"), description="binlog files, index and map")
    base: str = Field("databus-bin", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
                      description="file base name")
    server_id: int = Field(1, ge=1, le=2**32 - 1, description="@@server_id, in every event")
    rotate_bytes: int = Field(64 * 1024 * 1024, ge=4096, le=2**31,
                              description="rotate to a new file at this size")
    retention: float = Field(7 * 86400.0, gt=0, description="seconds a closed file is kept")
    purge_interval: float = Field(60.0, gt=0, description="seconds between purge checks")
    checkpoint_every: int = Field(1000, ge=1, description="most windows per fsync and map write")
    flush_delay: float = Field(0.002, ge=0, le=10,
                               description="quiet seconds after which received windows are"
                               " written and visible")
    poll_timeout: float = Field(2.0, ge=0.1, le=600, description="relay long-poll seconds")
    require_complete_history: bool = Field(
        False, description="a new binlog refuses a relay that cannot prove it holds its"
        " source's changes from the beginning")
    host: str = Field("127.0.0.1", description="address the MySQL-protocol server binds")
    port: int = Field(3307, ge=0, le=65535, description="its port; 0 picks a free one")
    user: str = Field("repl", min_length=1, description="replication user name")
    password_file: Path | None = Field(None, description="first line: the user's password")
    tls: TlsServerConfig | None = Field(None, description="server certificate and key")
    heartbeat: float = Field(30.0, ge=0, le=4294967,
                             description="heartbeat seconds when the client sets none; 0 = none")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics and /health/ready on this port"
        " (0: a free one, logged; docs/operations.md); None: no such listener")
    metrics_host: str = Field("127.0.0.1", description="address the metrics port binds")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, raw: Any) -> Any:
        return fold_relay_fields(raw, _LEGACY, "binlog service")

    def client_config(self) -> ClientConfig:
        """The converter's relay client settings."""
        return ClientConfig(relay=self.relay, sources=list(self.tables),
                            poll_timeout=self.poll_timeout,
                            checkpoint_every_windows=self.checkpoint_every,
                            consumer_name=f"binlog-server {self.server_id}@{gethostname()}")
