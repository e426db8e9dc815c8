"""``databus status``: the consumers of a relay (or of every member of a cluster) as a
table for a terminal, from each relay's ``GET /consumers`` (docs/operations.md).

Exit status: 0 when every relay answered; 3 when one could not be reached (the others
are printed); 2 for a refused token or a bad address.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from databus.cli.app import (
    RELAY_ACCESS_FLAGS,
    CaFileOpt,
    CertFileOpt,
    KeyFileOpt,
    RelayOpt,
    RelayTokenFileOpt,
    app,
    fail,
)
from databus.cli.flags import settings
from databus.core.errors import DatabusError

STATUS_FLAGS = {k: v.removeprefix("relay.") for k, v in RELAY_ACCESS_FLAGS.items()}
"""``databus status``'s relay options -> :class:`databus.core.access.RelayAccess`."""


@app.command()
def status(
    relay: RelayOpt,
    as_json: Annotated[bool, typer.Option("--json", help="print the relays' /consumers"
                                                         " answers as one JSON list")] = False,
    token_file: RelayTokenFileOpt = None,
    ca_file: CaFileOpt = None,
    cert_file: CertFileOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Print each relay's capture state and lag and the consumers it served lately: how
    far behind each is (seconds, windows), its state, and whether it is about to fall
    off the buffer (docs/operations.md)."""
    import httpx  # imported when run (see the app's docstring)

    from databus.client.credentials import Credentials, cert_failure
    from databus.core.access import RelayAccess
    from databus.core.config import validate

    try:
        access = validate(RelayAccess, settings(locals(), STATUS_FLAGS), "relay")
        creds = Credentials.from_env(**access.credential_fields())
        urls = _relays(access.url)
    except DatabusError as exc:
        fail(exc)
    answers: list[dict[str, Any]] = []
    unreachable = False
    with httpx.Client(headers=creds.headers(), verify=creds.ssl_context(),
                      timeout=30) as http:
        for url in urls:
            try:
                r = http.get(f"{url}/consumers")
            except httpx.HTTPError as exc:
                verify = cert_failure(exc)
                why = (f"its TLS certificate does not verify ({verify}); trust its CA with"
                       " --ca-file" if verify is not None else f"unreachable: {exc}")
                typer.echo(f"databus: relay {url}: {why}", err=True)
                if verify is not None:
                    raise typer.Exit(2) from exc
                unreachable = True
                continue
            if r.status_code in (401, 403):
                typer.echo(f"databus: relay {url} refused the token: {r.text}", err=True)
                raise typer.Exit(2)
            if r.status_code != 200:
                typer.echo(f"databus: relay {url}: HTTP {r.status_code}: {r.text[:200]}",
                           err=True)
                unreachable = True
                continue
            answers.append({"url": url, **r.json()})
    if as_json:
        typer.echo(json.dumps(answers, indent=2))
    else:
        for a in answers:
            typer.echo(render(a))
    if unreachable:
        raise typer.Exit(3)


def _relays(address: str) -> list[str]:
    """The relays to ask: each of comma-separated URLs, or every member of a cluster."""
    if not address.startswith("zk://"):
        return [u.strip().rstrip("/") for u in address.split(",") if u.strip()]
    from databus.coord import ClusterView, ZkAddress, connect

    addr = ZkAddress.parse(address)
    session = connect(addr, connect_timeout=10.0)
    try:
        members = ClusterView(session, addr).status()["members"]
    finally:
        session.close()
    return [str(m["url"]).rstrip("/") for m in members if m.get("url")]


def render(answer: dict[str, Any]) -> str:
    """One relay's ``/consumers`` answer as the lines ``databus status`` prints."""
    cap, buf = answer.get("capture") or {}, answer.get("buffer") or {}
    head = (f"relay {answer.get('relay', '?')} {answer.get('url', '')}: capture"
            f" {cap.get('state', '?')} ({cap.get('reads', '?')}), lag"
            f" {answer.get('lag_seconds', 0):.1f} s, buffer {buf.get('span_seconds', 0):.0f} s"
            f" (scn {buf.get('min_scn', -1)}..{buf.get('max_scn', -1)})")
    if cap.get("error"):
        head += f"\n  capture error: {cap['error']}"
    rows = answer.get("consumers") or []
    if not rows:
        return head + "\n  (no consumer seen lately)"
    width = max(24, *(len(c["name"]) for c in rows))
    lines = [head, f"  {'CONSUMER':<{width}}  {'STATE':<8} {'BEHIND s':>9} {'WINDOWS':>8}"
                   f" {'POSITION':>12}  {'SEEN':<8} TOKEN"]
    for c in rows:
        seen = f"{c['seen_seconds_ago']:.1f} s"
        line = (f"  {c['name']:<{width}}  {c['state']:<8} {c['seconds_behind']:>9.1f}"
                f" {c['windows_behind']:>8} {c['position']['scn']:>12}  {seen:<8}"
                f" {c.get('token') or '-'}")
        if c.get("falling_off"):
            line += f"  FALLING OFF ({c.get('fall_off_margin_seconds') or 0:.0f} s left)"
        lines.append(line)
    return "\n".join(lines)
