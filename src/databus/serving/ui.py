"""The operator's pages, ``GET /ui``: one self-contained HTML page a server serves
(docs/operations.md, "The page"): ``ui.html`` on a relay, ``ui_bootstrap.html`` on a
bootstrap server (its producer, applier and store, from its ``admin``).

Contract:

* The page is a package resource (``ui.html`` beside this module), read once and
  served as it is: inline CSS and one small inline script, nothing fetched from
  anywhere but the server that served it. Its script asks that server's own JSON
  endpoints every 2 seconds (``consumers``, ``health/ready``, ``admin``, by relative
  URL, so a reverse proxy's path prefix works) and draws what they answer; a failed
  or refused fetch is shown as such, never as zeros.
* Charts are plain inline SVG drawn by that script (a polyline per consumer of its
  seconds behind over the time the page has been open, kept in the browser, at most
  an hour): no charting library to ship or keep up to date, no build step, nothing
  downloaded, so the page works on a host without internet.
* Read-only and without secrets: it calls only GET endpoints; every string it shows
  goes in as text (never as HTML: consumer names come from clients), with the
  user-info of any URL (``//user:password@``) blanked out.
* Same access as the API: ``/ui`` is not an open path, so the server's guard asks
  the page for the same bearer token as ``/consumers``, and the page's own fetches
  carry only what the browser adds itself (a token in the URL, ``?token=``, is not
  read: URLs end up in logs and browser history). ``admin`` needs an admin token;
  without one the page shows what ``consumers`` tells and says what is missing.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

# the page runs only its own inline script and talks only to the server it came from
_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline';"
        " connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none';"
        " frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


PAGES = {"relay": "ui.html", "bootstrap": "ui_bootstrap.html"}


# a line of a page that stands for a shared file: "// @include F" or "/* @include F */"
_INCLUDE = re.compile(r"^(?://|/\*) @include (ui_common\.(?:js|css))(?: \*/)?$", re.M)


@cache
def page_html(kind: str = "relay") -> str:
    """The HTML of ``kind``'s page (package resources, read once): the page with what
    both pages share (``ui_common.css``, ``ui_common.js``) put where it says
    ``@include`` (inline: the CSP allows no other style or script)."""
    files = resources.files("databus.serving")
    page = files.joinpath(PAGES[kind]).read_text(encoding="utf-8")
    found = _INCLUDE.findall(page)
    if sorted(found) != ["ui_common.css", "ui_common.js"]:
        raise RuntimeError(f"{PAGES[kind]} must include ui_common.css and .js once each")
    return _INCLUDE.sub(lambda m: files.joinpath(m[1]).read_text(encoding="utf-8"), page)


def ui_route(kind: str = "relay") -> Route:
    """``GET /ui``: ``kind``'s page (a key of :data:`PAGES`; see the module docstring)."""
    html = page_html(kind)

    def page(_: Request) -> Response:
        return HTMLResponse(html, headers=_HEADERS)

    return Route("/ui", page, methods=["GET"])
