"""Checkpoint JSON contract and server-side filter parsing/matching."""

from __future__ import annotations

import json

import pytest

from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import InvalidCheckpointError, InvalidFilterError
from databus.core.filters import ServerFilter, key_hash


def test_checkpoint_uses_databus_field_names() -> None:
    cp = Checkpoint.after(42, prev_scn=40)
    raw = json.loads(cp.to_json())
    assert raw["windowScn"] == 42 and raw["windowOffset"] == -1 and raw["prevScn"] == 40
    assert raw["consumption_mode"] == "ONLINE_CONSUMPTION"
    assert Checkpoint.from_json(cp.to_json()) == cp


def test_checkpoint_progression() -> None:
    cp = Checkpoint.flexible()
    assert cp.is_flexible
    cp = cp.within(10, 3)
    assert (cp.window_scn, cp.window_offset, cp.in_window) == (10, 3, True)
    cp = cp.within(10, 7).window_done(10)
    assert (cp.window_scn, cp.window_offset) == (10, -1)
    cp2 = cp.window_done(20)
    assert (cp2.window_scn, cp2.prev_scn) == (20, 10)


@pytest.mark.parametrize("text", [
    "", "null", "[]", "1", '"x"', "{", '{"windowScn": "5"}', '{"windowScn": 1.5}',
    '{"windowScn": true}', '{"windowScn": -2}', '{"windowScn": 99999999999999999999}',
    '{"windowOffset": 3}', '{"consumption_mode": "SIDEWAYS"}', '{"unknown": 1}',
    "x" * 20000,
])
def test_bad_checkpoints_raise_typed_error(text: str) -> None:
    with pytest.raises(InvalidCheckpointError):
        Checkpoint.from_json(text)


def test_bootstrap_mode_parses() -> None:
    cp = Checkpoint.from_json(json.dumps({"consumption_mode": "BOOTSTRAP_SNAPSHOT",
                                          "snapshot_source": "main.t", "snapshot_offset": 5}))
    assert cp.consumption_mode is ConsumptionMode.BOOTSTRAP_SNAPSHOT


def test_mod_filter_partitions_keys() -> None:
    filters = [ServerFilter.mod([1], 4, b, b + 1) for b in range(4)]
    for key in [*range(-50, 50), b"abc", b"", "é".encode()]:
        hits = [f.matches(1, key) for f in filters]
        assert hits.count(True) == 1
        assert hits.index(True) == abs(key_hash(key)) % 4
    assert filters[0].matches(2, 3)  # other sources are not filtered


def test_range_filter_half_open_and_json_round_trip() -> None:
    f = ServerFilter.parse('{"3": {"partitionType": "RANGE", "filters": '
                           '[{"keyRange": {"start": 10, "end": 20}}]}}')
    assert [k for k in range(5, 25) if f.matches(3, k)] == list(range(10, 20))
    assert ServerFilter.parse(f.to_json()) == f


def test_key_hash_is_stable() -> None:
    # the contract: CRC-32 of the key bytes
    assert key_hash(b"hello") == 907060870
    assert key_hash(-5) == -5


@pytest.mark.parametrize("text", [
    "", "[]", "{", '{"x": {}}', '{"1": []}', '{"1": {"partitionType": "HASH", "filters": []}}',
    '{"1": {"partitionType": "MOD", "filters": []}}',
    '{"1": {"partitionType": "MOD", "filters": [{"numBuckets": 0, "bktRange": {"start": 0, "end": 1}}]}}',
    '{"1": {"partitionType": "MOD", "filters": [{"numBuckets": 4, "bktRange": {"start": 3, "end": 2}}]}}',
    '{"1": {"partitionType": "MOD", "filters": [{"numBuckets": 4, "bktRange": {"start": 0, "end": 9}}]}}',
    '{"1": {"partitionType": "MOD", "filters": [{"numBuckets": true, "bktRange": {"start": 0, "end": 1}}]}}',
    '{"1": {"partitionType": "RANGE", "filters": [{"keyRange": {"start": 0}}]}}',
    '{"1": {"partitionType": "RANGE", "filters": [{"keyRange": {"start": 0, "end": 1e400}}]}}',
])
def test_bad_filters_raise_typed_error(text: str) -> None:
    with pytest.raises(InvalidFilterError):
        ServerFilter.parse(text)
