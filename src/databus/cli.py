"""The ``databus`` command line.

Every command turns a :class:`~databus.core.errors.DatabusError` into a one-line
message on stderr and exit status 2 (terminal) or 3 (transient), never a
traceback. Commands parse options and call the part they run (the relay, the
runners of :mod:`databus.client.runners`, the bootstrap service); each imports
its part only when it runs, so a command does not load the others' dependencies
(the relay's sources and their drivers, SQLAlchemy, uvicorn).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
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
    from rich.console import Console  # imported when run: --help stays quick
    from rich.logging import RichHandler

    # logs go to stderr: stdout carries data (tail's JSON lines)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False,
                              rich_tracebacks=False)],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _fail(exc: DatabusError) -> None:
    typer.echo(f"databus: {exc.code}: {exc}", err=True)
    raise typer.Exit(3 if exc.retryable else 2)


def _csv(value: str | None) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()] if value else []


def _stop_on_sigterm() -> threading.Event:
    """An event SIGTERM sets. From a helper thread: a signal handler must not wait for
    a lock the thread it interrupted may hold (the event's own)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM,
                  lambda *_: threading.Thread(target=stop.set, daemon=True).start())
    return stop


@app.command()
def relay(
    config: Annotated[Path | None, typer.Option(help="relay YAML config file")] = None,
    source: Annotated[str | None, typer.Option(help="source URL, e.g. sqlite:///shop.db")] = None,
    tables: Annotated[str | None, typer.Option(help="comma-separated tables to capture")] = None,
    port: Annotated[int, typer.Option(help="HTTP port")] = 11115,
    buffer_path: Annotated[Path | None, typer.Option(help="persistent buffer file")] = None,
    buffer_size: Annotated[int | None, typer.Option(help="buffer capacity in bytes")] = None,
    snapshot_mode: Annotated[str | None, typer.Option(
        help="initial (default), initial_only, no_data, when_needed or always")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a relay: capture a source and serve its changes over HTTP."""
    from databus.relay.config import load_config  # imported when run (see top)
    from databus.relay.relay import Relay, config_from_args

    _setup_logging(verbose)
    try:
        if config is not None:
            if source is not None or tables is not None or snapshot_mode is not None:
                raise typer.BadParameter(
                    "give either --config or --source/--tables/--snapshot-mode")
            cfg = load_config(config)
        else:
            if source is None:
                raise typer.BadParameter("--config or --source is required")
            cfg = config_from_args(source, _csv(tables), port, buffer_path, buffer_size,
                                   snapshot_mode)
        r = Relay(cfg)
        signal.signal(signal.SIGTERM, r.request_exit)
        if config is not None:  # SIGHUP: re-read the source's tables from the file
            cfg_path = config
            signal.signal(signal.SIGHUP, lambda *_: r.reload(cfg_path))
        logging.getLogger("databus").info(
            "relay %s serving %s on http://%s:%d", cfg.name, cfg.source.url, cfg.http.host,
            cfg.http.port,
        )
        r.run()
    except DatabusError as exc:
        _fail(exc)


@app.command("signal")
def signal_cmd(
    kind: Annotated[str, typer.Argument(help="execute-snapshot, stop-snapshot, pause-snapshot"
                                              " or resume-snapshot")],
    relay: Annotated[str, typer.Option(help="relay URL, e.g. http://127.0.0.1:11115")],
    tables: Annotated[str | None, typer.Option(
        help="execute-snapshot: comma-separated regexes on db.table")] = None,
    data: Annotated[str | None, typer.Option(help="the signal's data as JSON")] = None,
) -> None:
    """Send a signal to a relay's source (incremental snapshots; see docs/snapshots.md)."""
    import httpx  # imported when run (see top)

    payload: dict[str, object] = {}
    if data:
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise typer.BadParameter(f"--data is not JSON: {exc}") from exc
    if tables:
        payload["data-collections"] = _csv(tables)
    try:
        r = httpx.post(f"{relay.rstrip('/')}/signal", json={"type": kind, "data": payload},
                       timeout=30)
    except httpx.HTTPError as exc:
        typer.echo(f"databus: relay {relay} unreachable: {exc}", err=True)
        raise typer.Exit(3) from exc
    if r.status_code != 202:
        typer.echo(f"databus: {r.text}", err=True)
        raise typer.Exit(2)
    typer.echo(r.json()["id"])


@app.command()
def tail(
    relay: Annotated[str, typer.Option(help="relay URL, e.g. http://127.0.0.1:11115")],
    sources: Annotated[str | None, typer.Option(help="comma-separated source names or ids")] = None,
    from_start: Annotated[bool, typer.Option(help="start with the oldest window the relay holds")] = False,
    max_windows: Annotated[int | None, typer.Option(help="stop after this many windows")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint file to resume from and keep")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="bootstrap server URL: print the snapshot first (and use it if the relay "
        "no longer holds the checkpoint)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Print every change as a JSON envelope, one per line.

    Without --from-start (and without a stored checkpoint) it starts at the
    newest window: only changes committed from now on are printed.
    """
    from databus.client.runners import tail as run_tail  # imported when run (see top)

    _setup_logging(verbose)
    try:
        # an interactive command: give up on an unreachable relay after a few tries
        run_tail(relay, sys.stdout, sources=_csv(sources), checkpoint=checkpoint,
                 from_start=from_start, bootstrap_url=bootstrap, relay_max_retries=5,
                 max_windows=max_windows, stop=_stop_on_sigterm())
    except DatabusError as exc:
        _fail(exc)


@app.command()
def replicate(
    relay: Annotated[str, typer.Option(help="relay URL")],
    target: Annotated[str, typer.Option(help="SQLAlchemy URL of the target database")],
    sources: Annotated[str | None, typer.Option(help="comma-separated source names or ids")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="bootstrap server URL: a new replica starts from its snapshot, and a replica "
        "the relay no longer holds catches up from it")] = None,
    bootstrap_batch: Annotated[int, typer.Option(
        help="snapshot rows / catch-up events per bootstrap request")] = 10_000,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Apply the change stream to same-named tables of a target database.

    Each window is applied in one target transaction together with the
    checkpoint (table databus_checkpoint), so a crash never applies a window
    twice or half.
    """
    from databus.client.runners import replicate as run_replicate  # imported when run

    _setup_logging(verbose)
    try:
        run_replicate(relay, target, sources=_csv(sources), bootstrap_url=bootstrap,
                      bootstrap_batch_size=bootstrap_batch, stop=_stop_on_sigterm())
    except DatabusError as exc:
        _fail(exc)


@app.command(name="bootstrap")
def bootstrap_cmd(
    config: Annotated[Path, typer.Option(help="bootstrap YAML config file")],
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a bootstrap service: producer, applier and server (docs/bootstrap.md)."""
    from databus.bootstrap.config import load_config  # imported when run (see top)
    from databus.bootstrap.service import BootstrapService

    _setup_logging(verbose)
    try:
        cfg = load_config(config)
        service = BootstrapService(cfg)
        signal.signal(signal.SIGTERM, service.request_exit)
        logging.getLogger("databus").info(
            "bootstrap %s: relay %s, store %s, serving on http://%s:%d", cfg.name,
            cfg.relay_url, cfg.store.url, cfg.http.host, cfg.http.port)
        service.run()
    except DatabusError as exc:
        _fail(exc)


@app.command()
def demo(
    transactions: Annotated[int, typer.Option(help="transactions the writer commits")] = 300,
    workdir: Annotated[Path, typer.Option(help="where the demo files go (recreated)")] = Path("demo-data"),
    quiet: Annotated[bool, typer.Option(help="do not print each change")] = False,
) -> None:
    """Run the SQLite -> relay -> consumers demo and check the replica."""
    from rich.console import Console  # imported when run (see top)

    from databus.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    try:
        ok = run_demo(workdir, transactions, quiet, Console())
    except DatabusError as exc:
        _fail(exc)
    raise typer.Exit(0 if ok else 1)


def main() -> None:
    """Entry point of the ``databus`` script."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
