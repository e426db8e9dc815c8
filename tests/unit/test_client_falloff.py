"""A consumer about to fall off the relay's buffer is warned about while there is time,
and the warning and the fall-off error name what would keep it on the relay."""

from __future__ import annotations

import logging

import pytest

from databus.client.falloff import FallOffWatch, remedy

S = 1_000_000_000  # ns per second


def _consume(watch: FallOffWatch, first: int, last: int) -> None:
    """Windows ``first``..``last``, one per second of source time (SCN = second)."""
    for scn in range(first, last + 1):
        watch.consumed(scn, scn * S)


def test_the_margin_is_the_source_time_between_the_oldest_window_and_the_position(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = FallOffWatch("http://relay:1", 30, bootstrap=False)
    _consume(watch, 100, 200)
    with caplog.at_level(logging.WARNING, "databus.client"):
        assert watch.answer(100) == pytest.approx(100)  # the first answer's oldest window
        assert watch.answer(120) == pytest.approx(80)  # 200 - 120
        assert watch.answer(150) == pytest.approx(50)
        assert not caplog.records
        assert watch.answer(175) == pytest.approx(25)  # within 30 s: warned
    assert watch.warnings == 1
    text = caplog.records[0].getMessage()
    assert "25.0 s of source time ahead of the oldest window relay http://relay:1" in text
    assert "--bootstrap" in text and "--buffer-size" in text and "--buffer-path" in text


def test_one_warning_a_minute_and_none_when_the_floor_is_older_than_what_was_seen(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = FallOffWatch("http://relay:1", 30, bootstrap=True)
    _consume(watch, 100, 110)
    assert watch.answer(50) is None  # the floor is before the first window seen
    with caplog.at_level(logging.WARNING, "databus.client"):
        for floor in (100, 101, 102, 103):
            watch.answer(floor)
    assert watch.warnings == 1 and len(caplog.records) == 1
    # with a bootstrap server configured, that is not offered again
    assert "--bootstrap" not in caplog.records[0].getMessage()


def test_samples_are_kept_one_per_second_of_source_time() -> None:
    watch = FallOffWatch("http://relay:1", 30, bootstrap=False)
    for i in range(1000):  # 1,000 windows in 10 s
        watch.consumed(i, i * S // 100)
    assert len(watch._samples) == 10


def test_no_warning_while_the_buffer_evicts_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    """A relay whose buffer is not full yet: its oldest window stays where it was, and a
    consumer close to it cannot fall off."""
    watch = FallOffWatch("http://relay:1", 30, bootstrap=False)
    with caplog.at_level(logging.WARNING, "databus.client"):
        for scn in range(1, 20):
            watch.consumed(scn, scn * S)
            assert watch.answer(1) == pytest.approx(scn - 1)
        assert watch.warnings == 0
        watch.answer(2)  # from now on it evicts
    assert watch.warnings == 1


def test_a_margin_of_zero_never_warns() -> None:
    watch = FallOffWatch("http://relay:1", 0, bootstrap=False)
    _consume(watch, 1, 10)
    assert watch.answer(9) is None and watch.warnings == 0


def test_the_remedy_names_the_flags_and_the_settings() -> None:
    assert remedy(False).startswith("give the consumer a bootstrap server (--bootstrap URL,"
                                    " bootstrap_url)")
    assert "buffer.capacity_bytes" in remedy(True) and "buffer.path" in remedy(True)
