"""What the fault tests need of the machine: ``nft`` (silent packet drops) and tmpfs
mounts (small disks), both as root (tests/support/faults.py). A test module asks with
``pytest.mark.usefixtures("nft")`` / ``("mount")`` and is skipped, saying why, where
the machine cannot."""

from __future__ import annotations

import pytest

from tests.support import faults


@pytest.fixture
def nft() -> None:
    reason = faults.nft_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def mount() -> None:
    reason = faults.mount_unavailable()
    if reason is not None:
        pytest.skip(reason)
