"""One holder per lock file, named to whoever is refused; the binlog service's data
directory is one such (two services writing one set of binlog files would corrupt it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from databus.binlog.store import BinlogStore
from databus.core.errors import ConfigError
from databus.core.lockfile import LockFile


def test_a_second_taker_is_refused_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    first = LockFile.take(path, {"what": "binlog service a", "pid": os.getpid(),
                                 "host": "h1", "data_dir": "/d"}, "refusing b")
    with pytest.raises(ConfigError, match=r"refusing b \(held by binlog service a, pid \d+"
                                          r" on h1, data_dir /d\)"):
        LockFile.take(path, {"what": "b"}, "refusing b")
    first.release()
    LockFile.take(path, {"what": "b"}, "refusing b").release()  # free again
    assert path.exists()  # the file stays (see the module docstring)


def test_two_binlog_services_never_share_a_data_directory(tmp_path: Path) -> None:
    store = BinlogStore(tmp_path / "bin")
    with pytest.raises(ConfigError, match=r"another binlog service writes them.*--data-dir"
                                          r".*held by binlog service databus-bin"):
        BinlogStore(tmp_path / "bin")
    other = BinlogStore(tmp_path / "bin", base="other")  # another base name: its own files
    other.close()
    store.close()
    BinlogStore(tmp_path / "bin").close()  # closed: the next one opens
