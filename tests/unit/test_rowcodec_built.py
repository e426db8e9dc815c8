"""Where a C compiler exists, the setup command builds the C accelerators: the
MySQL source's, the relay's, the client's and the Spark readers' speed depend on
them, so a silent build failure must show."""

from __future__ import annotations

import importlib
import shutil

import pytest


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler on this machine: the Python paths are used")
@pytest.mark.parametrize("module", ["databus.sources.mysql._rowcodec", "databus.buffer._select",
                                    "databus.client._wiredecode"])
def test_the_c_accelerators_are_built(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"run scripts/setup.sh: {module} did not build ({exc})")
