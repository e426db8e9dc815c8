"""Where a C compiler exists, the setup command builds the binlog row codec: the
MySQL source's speed depends on it, so a silent build failure must show."""

from __future__ import annotations

import shutil

import pytest

from databus.sources.mysql import fastpath


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler on this machine: the Python decoder is used")
def test_the_compiled_row_codec_is_built() -> None:
    assert fastpath.available(), "run scripts/setup.sh: the _rowcodec extension did not build"
