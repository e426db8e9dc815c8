"""The binlog store: map-first recovery, rotation, purge, GTID location, waiting."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from databus.binlog import events as ev
from databus.binlog.binfile import Transaction, Window
from databus.binlog.gtids import GtidSet
from databus.binlog.store import (
    BinlogGtidAheadError,
    BinlogPos,
    BinlogPurgedError,
    BinlogStore,
)
from databus.core.mysqlwire import FLAGS_OFFSET, LOG_EVENT_BINLOG_IN_USE_F, EventType

ROW = Transaction([(EventType.TABLE_MAP, 0, b"\x01" * 20)])


def _append(store: BinlogStore, scns: range) -> None:
    for scn in scns:
        store.append([Window(scn, 1_700_000_000_000_000 + scn, [ROW])])


def test_a_new_directory_gets_a_uuid_a_first_file_and_an_index(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path)
    assert s.files() == [("databus-bin.000001", s.end().pos)]
    assert (tmp_path / "databus-bin.index").read_text() == "./databus-bin.000001\n"
    assert s.gtid_executed() == "" and s.gtid_purged() == "" and s.last_scn() == -1
    uuid = s.server_uuid
    s.close()
    assert BinlogStore(tmp_path).server_uuid == uuid


def test_every_event_has_its_end_as_log_pos_and_a_valid_checksum(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path, rotate_bytes=600)
    _append(s, range(1, 12))
    for name, size in s.files():
        data = s.path(name).read_bytes()
        assert len(data) == size
        heads = list(ev.iter_headers(data))
        assert heads[-1].pos + heads[-1].size == size
        for h in heads:
            assert h.log_pos == h.pos + h.size
            assert ev.check_crc(data[h.pos:h.pos + h.size])
    assert s.gtid_executed() == f"{s.server_uuid}:1-11"
    s.close()


def test_a_tail_beyond_the_map_is_cut_on_restart(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path)
    _append(s, range(1, 4))
    end = s.end()
    s.close()
    with open(tmp_path / end.file, "ab") as fh:  # a torn transaction after a crash
        fh.write(b"\x00" * 37)
    s = BinlogStore(tmp_path)
    assert s.end() == end and (tmp_path / end.file).stat().st_size == end.pos
    _append(s, range(4, 5))
    assert [t.scn for t in s.transactions(end.file)] == [1, 2, 3, 4]
    s.close()


def test_a_rotation_the_map_did_not_record_is_undone(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path)
    _append(s, range(1, 3))
    state = (tmp_path / "databus-bin.state").read_bytes()
    end = s.end()
    s.close()
    s = BinlogStore(tmp_path, rotate_bytes=300)
    _append(s, range(3, 6))  # rotates
    assert len(s.files()) > 1
    s.close()
    (tmp_path / "databus-bin.state").write_bytes(state)  # crash before the map moved
    s = BinlogStore(tmp_path, rotate_bytes=300)
    assert s.files() == [(end.file, end.pos)] and s.last_scn() == 2
    assert sorted(p.name for p in tmp_path.glob("databus-bin.0*")) == [end.file]
    data = (tmp_path / end.file).read_bytes()
    assert data[4 + FLAGS_OFFSET] & LOG_EVENT_BINLOG_IN_USE_F  # current again
    s.close()


def test_a_foreign_file_with_our_name_is_left_alone(tmp_path: Path) -> None:
    BinlogStore(tmp_path).close()
    stray = tmp_path / "databus-bin.000007"
    stray.write_bytes(b"not ours")
    BinlogStore(tmp_path).close()
    assert stray.read_bytes() == b"not ours"


def test_purge_removes_old_closed_files_and_positions_in_them_fail(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path, rotate_bytes=300)
    _append(s, range(1, 9))
    names = [n for n, _ in s.files()]
    assert len(names) >= 3
    assert s.purge(time.time() - 3600) == []  # nothing old enough
    gone = s.purge(time.time() + 1)
    assert gone == names[:-1]  # never the current file
    assert [n for n, _ in s.files()] == names[-1:]
    assert not (tmp_path / names[0]).exists()
    assert (tmp_path / "databus-bin.index").read_text() == f"./{names[-1]}\n"
    first = next(s.transactions(names[-1])).gno
    assert s.gtid_purged() == f"{s.server_uuid}:1-{first - 1}"
    with pytest.raises(BinlogPurgedError, match="purged required binary logs"):
        s.locate_gtids("")
    with pytest.raises(BinlogPurgedError):
        s.check(BinlogPos(names[0], 4))
    assert s.locate_gtids(f"{s.server_uuid}:1-{first - 1}") == BinlogPos(
        names[-1], next(s.transactions(names[-1])).pos)
    s.close()


def test_locate_gtids_finds_the_first_missing_transaction(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path, rotate_bytes=400)
    _append(s, range(1, 10))
    txns = [t for n, _ in s.files() for t in s.transactions(n)]
    assert [t.gno for t in txns] == list(range(1, 10))
    u = s.server_uuid
    assert s.locate_gtids("") == BinlogPos(txns[0].file, txns[0].pos)
    assert s.locate_gtids(f"{u}:1-4:6-7") == BinlogPos(txns[4].file, txns[4].pos)
    other = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100"
    assert s.locate_gtids(f"{other},\n{u}:1-9") == s.end()
    with pytest.raises(BinlogGtidAheadError):
        s.locate_gtids(f"{u}:1-10")
    s.close()


def test_check_refuses_positions_past_the_committed_end(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path)
    _append(s, range(1, 3))
    s.check(s.end())
    with pytest.raises(BinlogPurgedError, match="position > file size"):
        s.check(BinlogPos(s.end().file, s.end().pos + 1))
    with pytest.raises(BinlogPurgedError):
        s.check(BinlogPos("databus-bin.000009", 4))
    s.close()


def test_wait_beyond_wakes_when_a_transaction_is_written(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path)
    end = s.end()
    assert not s.wait_beyond(end, 0.05)
    t = threading.Timer(0.1, lambda: _append(s, range(1, 2)))
    t.start()
    assert s.wait_beyond(end, 10)
    t.join()
    s.close()


def test_gtid_sets_parse_merge_and_print_like_mysql() -> None:
    u = "3E11FA47-71CA-11E1-9E33-C80AA9429562"
    g = GtidSet.parse(f"{u}:1-3:4-5:9, {u.lower()}:7")
    assert str(g) == "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7:9"
    assert g.contains(u.lower(), 4) and not g.contains(u.lower(), 6)
    assert str(GtidSet.parse("")) == ""


def test_the_store_never_writes_a_window_twice(tmp_path: Path) -> None:
    s = BinlogStore(tmp_path)
    _append(s, range(1, 3))
    with pytest.raises(Exception, match="not after"):
        _append(s, range(2, 3))
    s.close()
    assert os.path.exists(tmp_path / "databus-bin.state")


def test_a_read_lock_holds_appends_until_its_holder_releases_it(tmp_path: Path) -> None:
    store = BinlogStore(tmp_path)
    _append(store, range(1, 3))
    owner = object()
    store.hold(owner)  # FLUSH TABLES WITH READ LOCK
    end = store.end()
    th = threading.Thread(target=_append, args=(store, range(3, 5)))
    th.start()
    time.sleep(0.3)
    assert th.is_alive() and store.end() == end  # the binlog stands still
    store.release(owner)  # UNLOCK TABLES (or the connection ended)
    th.join(10)
    assert not th.is_alive() and store.last_scn() == 4
    store.release(owner)  # idempotent
    store.close()
