"""The ``databus`` command line.

Every command turns a :class:`~databus.core.errors.DatabusError` into a one-line
message on stderr and exit status 2 (terminal) or 3 (transient), never a
traceback.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from databus.core.errors import DatabusError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Databus for Python: change data capture relays, consumers and sinks.",
)


def _setup_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=None, show_path=False, rich_tracebacks=False)],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _fail(exc: DatabusError) -> None:
    typer.echo(f"databus: {exc.code}: {exc}", err=True)
    raise typer.Exit(3 if exc.retryable else 2)


def _csv(value: str | None) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()] if value else []


@app.command()
def relay(
    config: Annotated[Path | None, typer.Option(help="relay YAML config file")] = None,
    source: Annotated[str | None, typer.Option(help="source URL, e.g. sqlite:///shop.db")] = None,
    tables: Annotated[str | None, typer.Option(help="comma-separated tables to capture")] = None,
    port: Annotated[int, typer.Option(help="HTTP port")] = 11115,
    buffer_path: Annotated[Path | None, typer.Option(help="persistent buffer file")] = None,
    buffer_size: Annotated[int | None, typer.Option(help="buffer capacity in bytes")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a relay: capture a source and serve its changes over HTTP."""
    from databus.relay.config import load_config
    from databus.relay.relay import Relay, config_from_args

    _setup_logging(verbose)
    try:
        if config is not None:
            if source is not None or tables is not None:
                raise typer.BadParameter("give either --config or --source/--tables")
            cfg = load_config(config)
        else:
            if source is None:
                raise typer.BadParameter("--config or --source is required")
            cfg = config_from_args(source, _csv(tables), port, buffer_path, buffer_size)
        r = Relay(cfg)
        signal.signal(signal.SIGTERM, r.request_exit)
        logging.getLogger("databus").info(
            "relay %s serving %s on http://%s:%d", cfg.name, cfg.source.url, cfg.http.host,
            cfg.http.port,
        )
        r.run()
    except DatabusError as exc:
        _fail(exc)


def main() -> None:
    """Entry point of the ``databus`` script."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
