"""Waiting for a condition in tests: one deadline loop instead of one per test."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, *,
               interval: float = 0.05) -> T:
    """Calls ``predicate`` until it returns a truthy value and returns that value.

    Raises ``AssertionError`` naming ``what`` (and the last falsy value seen) when
    ``timeout`` seconds pass first. An exception raised by ``predicate`` propagates
    at once: a predicate that knows the wait is hopeless (a process exited) says so.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} "
                                 f"(last value: {last!r})")
        time.sleep(interval)
