"""Query parameters of a request, parsed and checked before an endpoint uses them.

Contract: :func:`int_param`, :func:`float_param`, :func:`bool_param` and
:func:`source_ids_param` return the parameter's value, its default when it is absent,
or raise :class:`~databus.core.errors.InvalidRequestError` (a 400 naming the
parameter and, cut to 50 characters, what was given); :func:`source_ids_param` raises
:class:`~databus.core.errors.UnknownSourceError` (404) for an id the server does not
serve. An endpoint therefore never sees a bad value, and a bad one never reaches the
500 handler.
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.requests import Request

from databus.core.errors import InvalidRequestError, UnknownSourceError

MAX_SOURCE_IDS = 10_000  # ids one request may name


def int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """The integer query parameter ``name`` in ``[lo, hi]``; ``default`` when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be an integer, got {raw[:50]!r}") from None
    if not lo <= value <= hi:
        raise InvalidRequestError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def float_param(request: Request, name: str, default: float, lo: float, hi: float) -> float:
    """The number query parameter ``name`` in ``[lo, hi]`` (NaN refused); ``default``
    when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be a number, got {raw[:50]!r}") from None
    if not lo <= value <= hi:  # also rejects NaN
        raise InvalidRequestError(f"{name} must be between {lo} and {hi}, got {raw[:50]}")
    return value


def bool_param(request: Request, name: str, default: bool = False) -> bool:
    """``true``/``1``/``yes`` or ``false``/``0``/``no`` (any case); ``default`` when absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = raw.lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidRequestError(f"{name} must be true or false, got {raw[:50]!r}")


def source_ids_param(request: Request, known: Collection[int],
                     name: str = "sources") -> frozenset[int] | None:
    """``sources=1,2`` -> those ids, each one of ``known`` (else ``UnknownSource``);
    None when absent or empty, which means every source."""
    text = request.query_params.get(name)
    if text is None or not text.strip():
        return None
    ids: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            sid = int(part)
        except ValueError:
            raise InvalidRequestError(
                f"{name} must be comma-separated ids, got {part[:50]!r}") from None
        if sid not in known:
            raise UnknownSourceError(f"unknown source id {sid}; known: {sorted(known)}")
        ids.add(sid)
        if len(ids) > MAX_SOURCE_IDS:
            raise InvalidRequestError(f"{name} names more than {MAX_SOURCE_IDS} sources")
    return frozenset(ids)
