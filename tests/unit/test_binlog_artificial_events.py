"""The dump's own events (the artificial Rotate, Heartbeat) carry a CRC32 a verifying
replica accepts, and a state file that is not an object is refused in one line."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from databus.binlog.events import check_crc, fake_rotate, heartbeat
from databus.binlog.store import BinlogStore
from databus.core.errors import ConfigError
from databus.core.mysqlwire import LEN_OFFSET


@pytest.mark.parametrize("make", [fake_rotate, heartbeat])
def test_artificial_events_have_their_size_and_a_good_checksum(make: object) -> None:
    assert callable(make)
    with_crc = make(7, "databus-bin.000002", 4, True)
    assert struct.unpack_from("<I", with_crc, LEN_OFFSET)[0] == len(with_crc)
    assert check_crc(with_crc)
    without = make(7, "databus-bin.000002", 4, False)
    assert struct.unpack_from("<I", without, LEN_OFFSET)[0] == len(without)
    assert with_crc[:len(without)][:LEN_OFFSET] == without[:LEN_OFFSET]


def test_a_state_file_that_is_not_an_object_is_refused_in_one_line(tmp_path: Path) -> None:
    BinlogStore(tmp_path).close()
    (tmp_path / "databus-bin.state").write_text("[]")
    with pytest.raises(ConfigError, match="is not a databus binlog state"):
        BinlogStore(tmp_path)
