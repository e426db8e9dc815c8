"""The services beside relays: ``databus bootstrap`` and ``databus binlog-server``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from databus.cli.app import (
    RELAY_ACCESS_FLAGS,
    HostOpt,
    TlsCertOpt,
    TlsClientCaOpt,
    TlsKeyOpt,
    VerboseOpt,
    app,
    fail,
    private_files,
    relay_client,
    serve_until_signal,
    setup_logging,
    stop_on_signals,
)
from databus.cli.flags import csv, settings
from databus.core.errors import DatabusError
from databus.core.redact import redact_url, url_password

if TYPE_CHECKING:
    from collections.abc import Mapping

    from databus.binlog.config import BinlogServiceConfig


@app.command(name="bootstrap")
def bootstrap_cmd(
    config: Annotated[Path, typer.Option(help="bootstrap YAML config file")],
    verbose: VerboseOpt = False,
) -> None:
    """Run a bootstrap service: producer, applier and server (docs/bootstrap.md)."""
    redactor = setup_logging(verbose)
    try:
        from databus.bootstrap.config import load_config  # imported when run
        from databus.bootstrap.service import BootstrapService

        private_files()
        cfg = load_config(config)
        redactor.add(url_password(cfg.store.url), url_password(cfg.store.connect_url()))
        service = BootstrapService(cfg)
        logging.getLogger("databus").info(
            "bootstrap %s: relay %s, store %s", cfg.name, cfg.relay.url,
            redact_url(cfg.store.url))
        serve_until_signal(service, service.reload_tokens)
    except DatabusError as exc:
        fail(exc, redactor)


BINLOG_FLAGS = {
    **RELAY_ACCESS_FLAGS, "port": "port", "user": "user", "password_file": "password_file",
    "data_dir": "data_dir", "server_id": "server_id", "tables": "tables", "host": "host",
    "tls_cert": "tls.cert_file", "tls_key": "tls.key_file",
    "tls_client_ca": "tls.client_ca_file", "metrics_port": "metrics_port",
    "metrics_host": "metrics_host",
}
"""``databus binlog-server``'s options -> :class:`databus.binlog.config.BinlogServiceConfig`."""


def binlog_config(config: Path | None, values: Mapping[str, Any]) -> BinlogServiceConfig:
    """The binlog service's config: the ``config`` file with the options given laid over
    it, or the options alone."""
    from databus.binlog.config import BinlogServiceConfig
    from databus.core.config import merged, read_file, validate
    from databus.core.errors import ConfigError

    over = settings({**values, "tables": csv(values.get("tables"))}, BINLOG_FLAGS)
    raw = read_file(config) if config is not None else {}
    if isinstance(raw.get("relay"), str):  # the file's shorthand, so options merge into it
        raw["relay"] = {"url": raw["relay"]}
    raw = merged(raw, over)
    if "relay" not in raw:
        raise typer.BadParameter("--relay (or relay: in --config) is required")
    try:
        cfg = validate(BinlogServiceConfig, raw, "binlog service")
    except ConfigError as exc:
        raise ConfigError(f"{config} with the options given: {exc}" if config else str(exc)
                          ) from exc
    if cfg.password_file is None:
        raise ConfigError("--password-file (or password_file: in --config) is required")
    return cfg


@app.command(name="binlog-server")
@relay_client
def binlog_server(
    relay: Annotated[str | None, typer.Option(
        help="relay URL, comma-separated relays, or a relay cluster zk://HOST:PORT/NAME")] = None,
    port: Annotated[int | None, typer.Option(help="MySQL protocol port (default 3307)")] = None,
    user: Annotated[str | None, typer.Option(help="replication user name (default repl)")] = None,
    password_file: Annotated[Path | None, typer.Option(
        help="file whose first line is that user's password")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="directory of the binlog files, index and position map")] = None,
    server_id: Annotated[int | None, typer.Option(help="@@server_id of the service")] = None,
    tables: Annotated[str | None, typer.Option(
        help="comma-separated db.table to convert (default: every table of the relay)")] = None,
    config: Annotated[Path | None, typer.Option(
        help="binlog service YAML config file (options given here win)")] = None,
    host: HostOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: TlsClientCaOpt = None,
    verbose: VerboseOpt = False,
    **options: Any,
) -> None:
    """Serve a relay's changes as MySQL binlog files over the MySQL replication protocol,
    for binlog readers (python-mysql-replication, mariadb-binlog, Debezium, ...);
    docs/binlog-service.md."""
    import signal

    values = {**locals(), **options}
    redactor = setup_logging(verbose)
    if not verbose:  # mysql-mimic logs every connection's start and end at INFO
        logging.getLogger("mysql_mimic").setLevel(logging.WARNING)
    try:
        try:
            from databus.binlog.server import run_service  # imported when run
        except ImportError as exc:
            from databus.core.errors import ConfigError

            raise ConfigError("databus binlog-server needs mysql-mimic: pip install"
                              " 'databus[binlog]'") from exc
        from databus.client.credentials import read_secret_file

        private_files()
        cfg = binlog_config(config, values)
        assert cfg.password_file is not None  # binlog_config refuses a config without it
        password = read_secret_file(cfg.password_file, "password file")
        redactor.add(password)
        stop = stop_on_signals(signal.SIGINT)
        logging.getLogger("databus").info("binlog service: relay %s, data %s, port %d",
                                          cfg.relay.url, cfg.data_dir, cfg.port)
        run_service(cfg, password, stop)
    except DatabusError as exc:
        fail(exc, redactor)
