"""Buffer recovery's scan of a persisted region: the compiled scan (``_select.c``) and its
Python twin find the same windows and stop at the same place, for the same reason."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from databus.buffer.persist import _scan_segment
from databus.buffer.select import scan_windows as compiled_scan
from databus.core import event as ev

pytestmark = pytest.mark.skipif(compiled_scan is None, reason="_select extension not built")


def _region(windows: int = 30) -> tuple[bytearray, list[int]]:
    """Windows 1..n of 0-4 data events each and their EOPs, and each window's offset."""
    rng = random.Random(7)
    out, starts = bytearray(), []
    for scn in range(1, windows + 1):
        starts.append(len(out))
        for k in range(rng.randrange(5)):
            out += ev.encode(scn=scn, src_id=1, key=scn * 10 + k,
                             payload=bytes(rng.randrange(256) for _ in range(rng.randrange(120))))
        out += ev.encode_eop(scn, scn * 1000)
    return out, starts


def _flip(at: int) -> Callable[[bytearray, list[int]], None]:
    def damage(mem: bytearray, starts: list[int]) -> None:
        mem[starts[12] + at] ^= 0xFF
    return damage


DAMAGE: dict[str, Callable[[bytearray, list[int]], None]] = {
    "none": lambda mem, starts: None,
    "version": _flip(0),
    "magic": _flip(2),
    "header crc": _flip(10),
    "body crc": _flip(14),
    "total length": _flip(18),
    "timestamp (header crc)": _flip(25),
    "scn (header crc)": _flip(40),
    "payload (body crc)": _flip(50),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("cut", [0, 1, 44, 100])
def test_the_compiled_scan_is_its_python_twin(damage: str, cut: int) -> None:
    assert compiled_scan is not None
    mem, starts = _region()
    DAMAGE[damage](mem, starts)
    stop = len(mem) - cut  # a cut inside the last window(s): a torn tail
    for last_scn in (-1, 0, 2):
        want = _scan_segment(mem, starts[2] if last_scn == 2 else 0, stop, last_scn)
        got = compiled_scan(mem, starts[2] if last_scn == 2 else 0, stop, last_scn)
        assert got == want
        windows, end, error = got
        if damage == "none" and cut == 0:
            assert error is None and len(windows) == (30 if last_scn < 2 else 28)
        elif damage == "none":  # a torn tail: the windows before it are kept
            assert error is not None and end in starts[-3:]
        else:  # nothing from the damaged window on
            assert error is not None and end == starts[12]
            assert [w[0] for w in windows] == list(range(1 if last_scn < 2 else 3, 13))


def test_an_scn_not_above_the_last_one_is_where_both_stop() -> None:
    mem, _starts = _region()
    for scan in (_scan_segment, compiled_scan):
        assert scan is not None
        windows, end, error = scan(mem, 0, len(mem), 3)
        assert (windows, end, error) == ([], 0, "scn 1 not above 3")
