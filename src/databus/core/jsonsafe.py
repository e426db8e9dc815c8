"""JSON from outside (request bodies, query parameters): parsed with a nesting limit.

``json.loads`` recurses per nesting level and raises ``RecursionError`` near Python's
recursion limit: a request made of ``[[[[...`` would be a 500 and a traceback. Here
it is a ``ValueError`` (callers turn it into their 400), and anything nested deeper
than ``max_depth`` is refused the same way before it reaches the code that walks it.
"""

from __future__ import annotations

import json
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
