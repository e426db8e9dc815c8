"""``databus token`` (the servers' token files) and ``databus demo``."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from databus.cli.app import app, fail
from databus.cli.flags import regexes
from databus.core.errors import DatabusError

token_app = typer.Typer(no_args_is_help=True, help="Manage the bearer tokens of a token file"
                        " (servers re-read it on SIGHUP; docs/security.md).")
app.add_typer(token_app, name="token")
TokenFileArg = Annotated[Path, typer.Option(
    "--file", envvar="DATABUS_SERVER_TOKEN_FILE",
    help="the servers' token file (created 0600 if missing)")]


@token_app.command("add")
def token_add(
    name: Annotated[str, typer.Argument(help="who holds the token (letters, digits, _ -)")],
    file: TokenFileArg,
    tables: Annotated[str, typer.Option(
        help="comma-separated regexes of the tables it may read, e.g. 'shop\\..*'")] = "",
    admin: Annotated[bool, typer.Option("--admin", help="may signal and read /admin")] = False,
    replace: Annotated[bool, typer.Option(
        "--replace", help="rotate: replace an existing token of that name")] = False,
) -> None:
    """Add a token: print it once (stdout) and store only its hash."""
    from databus.auth import add_token  # imported when run (see top)

    os.umask(0o077)
    try:
        token = add_token(file, name, regexes(tables) or [], admin=admin, replace=replace)
    except DatabusError as exc:
        fail(exc)
    typer.echo(token)
    typer.echo(f"databus: token {name!r} added to {file}; it is shown only now. Servers"
               " use it after their next start or SIGHUP.", err=True)


@token_app.command("remove")
def token_remove(
    name: Annotated[str, typer.Argument(help="the token's name")],
    file: TokenFileArg,
) -> None:
    """Revoke a token (servers stop accepting it at their next SIGHUP)."""
    from databus.auth import remove_token  # imported when run (see top)

    try:
        remove_token(file, name)
    except DatabusError as exc:
        fail(exc)


@token_app.command("list")
def token_list(file: TokenFileArg) -> None:
    """Names, tables and admin flags of a token file (never the hashes)."""
    from databus.auth import read_grants  # imported when run (see top)

    try:
        grants = read_grants(file)
    except DatabusError as exc:
        fail(exc)
    for g in grants.values():
        typer.echo(f"{g.name}\t{'admin' if g.admin else '-'}\t{','.join(g.tables)}")


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
        fail(exc)
    raise typer.Exit(0 if ok else 1)
