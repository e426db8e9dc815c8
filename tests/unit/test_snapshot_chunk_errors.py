"""A database error while reading a snapshot chunk stops the snapshot loudly, and its
text (which may quote values or names) stays in the relay's log, out of the stream."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest

from databus.core.errors import StatementError
from databus.sources.common.incremental import ChunkReader, Coordinator


class FailingReader(ChunkReader):
    """A reader whose every chunk SELECT is refused by the database."""

    def write_watermark(self, wid: str, kind: str, data: str) -> None:
        pass

    def tables(self) -> list[str]:
        return ["shop.t"]

    def max_key(self, table: str, key: Sequence[str] | None, condition: str | None
                ) -> tuple[list[Any] | None, list[str]]:
        raise StatementError("SELECT failed (error 1054): Unknown column 'secret-value'")


def test_a_chunk_error_aborts_without_the_database_text(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    coord = Coordinator(FailingReader(), 100, lambda _t: True)
    coord.start(["shop.t"], "s1")
    with caplog.at_level(logging.ERROR, logger="databus.sources"):
        notices = coord.open_chunk()
    kinds = [n["kind"] for n in notices]
    assert kinds == ["ERROR", "ABORTED"] and not coord.active
    text = repr(notices)
    assert "secret-value" not in text and "StatementError" in text
    assert "secret-value" in caplog.text  # the operator sees it in the log
