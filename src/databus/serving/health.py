"""Health endpoints every server shares: ``GET /health/live`` and ``GET /health/ready``.

Contract (docs/operations.md, "Health"):

* ``/health/live``: 200 ``{"status": "live", "service": <name>}`` while the server
  answers HTTP at all (the guard's ``/health`` answers the same way, as before).
* ``/health/ready``: 200 ``{"status": "ready", ...}`` when every check the server
  makes passes, else 503 ``{"status": "not_ready", ...}``; both with ``checks``, a list
  of ``{"name", "ok", "detail"}``. What a server checks is its own (the relay: capture
  runs; the bootstrap server: producer, applier, store; a consumer's metrics port: the
  consumer's state). Details name states and error codes, never error messages (the
  paths are open: no token).
* Both are open paths (:attr:`databus.serving.HttpService.open_paths`) and plain
  functions, so a check may block briefly (Starlette runs them in its thread pool).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

LIVE = "/health/live"
READY = "/health/ready"


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness check: its name, whether it passes, and why (one line)."""

    name: str
    ok: bool
    detail: str


def health_routes(service: str, checks: Callable[[], list[Check]],
                  name: Callable[[], str] | None = None) -> list[Route]:
    """The two routes for a server called ``service`` whose readiness ``checks()``
    decides; ``name()``: the instance's name, shown beside (a relay's)."""

    def live(_: Request) -> Response:
        return JSONResponse({"status": "live", "service": service})

    def ready(_: Request) -> Response:
        done = checks()
        ok = all(c.ok for c in done)
        body: dict[str, object] = {"status": "ready" if ok else "not_ready",
                                   "service": service}
        if name is not None:
            body["name"] = name()
        body["checks"] = [asdict(c) for c in done]
        return JSONResponse(body, status_code=200 if ok else 503)

    return [Route(LIVE, live), Route(READY, ready)]
