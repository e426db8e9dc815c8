"""Bootstrap service configuration (``databus bootstrap --config FILE``).

Example::

    relay: http://127.0.0.1:11115       # or url:, token_file:, ca_file:, ... (RelayAccess)
    store:
      url: sqlite:///bootstrap.db       # or postgresql+psycopg://..., mysql+pymysql://...
    initial_load:                       # optional: tables that had rows before capture
      url: sqlite:///shop.db
      tables: [orders, customers]
    http:
      port: 11116
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from sqlalchemy.engine import make_url

from databus.client.credentials import read_secret_file
from databus.core.access import RelayAccess, fold_relay_fields
from databus.core.config import FrozenModel, RegexList, load_file, validate
from databus.serving.config import HttpServerConfig
from databus.sources.config import ColumnRule

_Model = FrozenModel


class StoreConfig(_Model):
    url: str = Field(description="SQLAlchemy URL of the log and snapshot store")
    password_file: Path | None = Field(
        None, description="file whose first line is the store's password (instead of one"
        " in the URL, where process lists and configs show it)")

    def connect_url(self) -> str:
        """``url`` with the password of ``password_file`` when one is given."""
        if self.password_file is None:
            return self.url
        password = read_secret_file(self.password_file, "password file")
        return make_url(self.url).set(password=password).render_as_string(hide_password=False)


class InitialLoadConfig(_Model):
    """Read the tables' current rows once, at a known SCN, before producing."""

    url: str = Field(description="the captured source, sqlite:///PATH.db")
    tables: list[str] = Field(min_length=1, description="tables to load (the relay's tables)")
    columns: list[ColumnRule] = Field(
        default_factory=list, description="the relay's column protection rules"
        " (source.columns): the initial load reads the database itself, so it applies"
        " them too; a load whose tables the relay protects must repeat them here")
    include_columns: RegexList = Field(
        default_factory=list, description="the relay's source.include_columns, repeated:"
        " regexes on 'table.column' or 'main.table.column' to keep (empty = all)")
    exclude_columns: RegexList = Field(
        default_factory=list, description="the relay's source.exclude_columns, repeated:"
        " columns left out are never read by the load (key columns always kept); without"
        " them the store holds the columns the relay leaves out, under schemas it does"
        " not serve")

    @field_validator("url")
    @classmethod
    def _sqlite(cls, v: str) -> str:
        if not v.startswith("sqlite:///") or len(v) <= len("sqlite:///"):
            raise ValueError("initial load supports sqlite:///PATH.db sources")
        return v

    @property
    def path(self) -> Path:
        return Path(self.url[len("sqlite:///"):])


class BootstrapHttpConfig(HttpServerConfig):
    """The bootstrap server's listener, tokens, TLS and limits
    (:class:`databus.serving.HttpServerConfig`)."""

    port: int = Field(11116, ge=0, le=65535, description="0 picks a free port")


class BootstrapConfig(_Model):
    """Producer, applier and server of one bootstrap service."""

    name: str = Field("bootstrap", min_length=1, max_length=100)
    relay: RelayAccess = Field(
        description="the relay the producer pulls from: its URL (a list of relays, or"
        " zk://HOST:PORT/NAME), or the whole section with its credentials (token_file,"
        " ca_file, cert_file, key_file; default: DATABUS_TOKEN / DATABUS_TOKEN_FILE,"
        " DATABUS_CA_FILE, ...)")
    store: StoreConfig
    initial_load: InitialLoadConfig | None = None
    http: BootstrapHttpConfig = BootstrapHttpConfig()
    fetch_size: int = Field(8 << 20, ge=1024, description="producer bytes per /stream request")
    poll_timeout: float = Field(2.0, ge=0, le=60, description="producer long-poll seconds")
    apply_batch_windows: int = Field(500, ge=1, description="windows folded per transaction")
    apply_interval: float = Field(0.2, gt=0, description="applier idle poll seconds")
    log_retention: float | None = Field(
        None, gt=0, description="seconds a window stays in the log after it was stored (and "
        "folded); None = forever. Consumers further behind get a snapshot bootstrap; a "
        "bootstrap that takes longer than this gets BootstrapTooYoung and starts again")
    trim_interval: float = Field(60.0, gt=0, description="seconds between log trims")
    default_batch: int = Field(10_000, ge=1, description="rows per /bootstrap by default")
    progress_interval: float = Field(2.0, gt=0, description="seconds between progress lines")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, raw: Any) -> Any:
        return fold_relay_fields(raw, {"relay_url": "url", "relay_token_file": "token_file",
                                       "relay_ca_file": "ca_file"}, "bootstrap")


def parse_config(raw: Any) -> BootstrapConfig:
    """Validate a mapping; raises :class:`ConfigError` naming each bad field."""
    return validate(BootstrapConfig, raw, "bootstrap")


def load_config(path: Path) -> BootstrapConfig:
    """Read and validate a YAML/JSON config file."""
    return load_file(path, parse_config)
