"""Snapshot progress records (databus.sources.common.progress)."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pytest

from databus.core.errors import SchemaError
from databus.sources.common.progress import ProgressRecords


def test_round_trip_and_lookup(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    r = ProgressRecords(path)
    state = {"last_key": [b"\x00\xff", decimal.Decimal("1.50"), dt.date(2024, 1, 2), 1.5, "x"]}
    r.add(10, state)
    r.add(20, None)
    again = ProgressRecords(path)
    assert again.at(9) is None and again.at(10) == state and again.at(15) == state
    assert again.at(20) is None and again.at(99) is None


def test_add_drops_records_at_or_after_a_rewound_scn(tmp_path: Path) -> None:
    r = ProgressRecords(tmp_path / "p.json")
    for scn in (1, 2, 3):
        r.add(scn, {"n": scn})
    r.add(2, {"n": 20})  # the relay restarted after 1 and redid window 2
    assert [s for s, _ in r.records] == [1, 2] and r.at(3) == {"n": 20}


def test_keep_caps_records_and_none_keeps_all_until_forgotten(tmp_path: Path) -> None:
    capped = ProgressRecords(None, keep=3)
    for scn in range(10):
        capped.add(scn, {"n": scn})
    assert [s for s, _ in capped.records] == [7, 8, 9]
    path = tmp_path / "p.json"
    r = ProgressRecords(path, keep=None)
    for scn in range(200):
        r.add(scn, {"n": scn})
    assert len(r.records) == 200 and r.at(0) == {"n": 0}
    r.forget_before(150, keep_last=10)
    assert r.records[0][0] == 150 and r.at(150) == {"n": 150}
    r.forget_before(199, keep_last=10)
    assert [s for s, _ in r.records] == list(range(190, 200))
    assert [s for s, _ in ProgressRecords(path, keep=None).records] == list(range(190, 200))


def test_unreadable_file_is_a_schema_error(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(SchemaError):
        ProgressRecords(path)
