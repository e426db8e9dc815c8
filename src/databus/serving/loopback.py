"""The one answer to "is this host loopback?", for every rule of a server that asks it.

Two rules ask, and they must agree for one server (docs/security.md):

* the **token rule** (:class:`~databus.serving.service.HttpService`): a server whose
  bind address is not loopback refuses to start without a token file (or ``insecure``);
* the **Host check** of state-changing requests (:func:`~databus.serving.requests.
  json_body`): a server bound to loopback takes them only with a loopback ``Host``
  header, so a web page, even through DNS rebinding, cannot drive it.

Contract:

* :func:`is_loopback` is true for ``localhost`` (any case, with or without the
  trailing dot of a fully qualified name), every address of 127.0.0.0/8 (Linux routes
  all of it to ``lo``), ``::1`` (bracketed or not) and an IPv4-mapped IPv6 form of
  127.0.0.0/8 (``::ffff:127.0.0.5``); false for everything else, including the empty
  string, a wildcard (``0.0.0.0``, ``::``), a name ending in ``.localhost`` (its
  address is up to the resolver) and anything that is not an address or ``localhost``.
* :func:`host_name` is the host a ``Host`` header names: without its port
  (``127.0.0.5:8080`` -> ``127.0.0.5``), without the brackets of an IPv6 literal
  (``[::1]:80`` -> ``::1``; brackets hold IPv6 only); an unbracketed header with more than one colon is an IPv6
  address without a port (``::1``). A header that is not a host with an optional
  decimal port (``[::1``, ``localhost:http``, empty) names no host: ``""``, which is
  not loopback, so such a request is refused wherever loopback is required.
"""

from __future__ import annotations

import ipaddress

_LOCALHOST = frozenset({"localhost", "localhost."})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address, or :func:`host_name` of a ``Host`` header)
    names this machine only."""
    if host.lower() in _LOCALHOST:
        return True
    try:
        if host.startswith("[") and host.endswith("]"):  # brackets hold IPv6 only
            address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv6Address(
                host[1:-1])
        else:
            address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 (Python before 3.13 calls it not loopback)
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def host_name(header: str) -> str:
    """The host a ``Host`` header names, without port or brackets; ``""`` for a header
    that is not ``host[:port]`` (see the module docstring)."""
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket or ":" not in name or (rest and not _is_port(rest, colon=True)):
            return ""  # unclosed, not IPv6 (RFC 3986 brackets no other), or a bad port
        return name
    if header.count(":") > 1:
        return header  # an IPv6 address without brackets, hence without a port
    name, colon, port = header.partition(":")
    if colon and not _is_port(port):
        return ""
    return name


def _is_port(text: str, *, colon: bool = False) -> bool:
    """``text`` is a decimal port, after a ``:`` when ``colon``; an empty port is
    allowed (RFC 3986, 3.2.3)."""
    if colon:
        if not text.startswith(":"):
            return False
        text = text[1:]
    return text == "" or (text.isascii() and text.isdigit())
