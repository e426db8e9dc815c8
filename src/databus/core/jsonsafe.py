"""JSON from outside (request bodies, query parameters): parsed with a nesting limit.

``json.loads`` recurses per nesting level and raises ``RecursionError`` near Python's
recursion limit: a request made of ``[[[[...`` would be a 500 and a traceback. Here
it is a ``ValueError`` (callers turn it into their 400), and anything nested deeper
than ``max_depth`` is refused the same way before it reaches the code that walks it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 32


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises ``ValueError`` for bad JSON and for nesting deeper than
    ``max_depth`` (objects and arrays)."""
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from exc
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise ValueError(f"JSON nested deeper than {max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return value


def loads_bounded(text: str | bytes, max_bytes: int, what: str,
                  error: Callable[[str], Exception]) -> Any:
    """:func:`loads` of a document from outside no longer than ``max_bytes``; a longer
    one, bad JSON or too deep nesting raise ``error`` with a message naming ``what``."""
    if len(text) > max_bytes:
        raise error(f"{what} longer than {max_bytes} bytes")
    try:
        return loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from exc
