"""The relay's short-buffer warning (``databus.relay.bufferspan``): when it fires, how
often, and what it tells the operator."""

from __future__ import annotations

import logging

import pytest

from databus.relay.bufferspan import BufferSpanWatch

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_full_buffer_spanning_less_than_the_setting_warns_at_most_every_period(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = BufferSpanWatch(300, every=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="databus.relay.buffer"):
        assert watch.check(evicted=5, span_seconds=30.0, capacity=64 * MiB)
        clock.now = 59
        assert watch.check(evicted=9, span_seconds=31.0, capacity=64 * MiB)
        assert len(_warnings(caplog)) == 1 and watch.warnings == 1  # rate-limited
        clock.now = 61
        assert watch.check(evicted=12, span_seconds=29.0, capacity=64 * MiB)
        assert len(_warnings(caplog)) == 2 and watch.short
        first = _warnings(caplog)[0]
    # the span, the capacity, what would hold the setting, and every remedy
    assert "30.0 s" in first and "64 MiB" in first and "buffer.min_span_seconds 300" in first
    assert "about 640 MiB" in first
    for remedy in ("--buffer-size", "buffer.capacity_bytes", "--buffer-path", "--bootstrap"):
        assert remedy in first, remedy


def test_not_short_while_nothing_was_evicted_above_the_setting_or_when_off(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="databus.relay.buffer"):
        assert not BufferSpanWatch(300).check(evicted=0, span_seconds=1.0, capacity=MiB)
        assert not BufferSpanWatch(300).check(evicted=3, span_seconds=301.0, capacity=MiB)
        assert not BufferSpanWatch(0).check(evicted=3, span_seconds=1.0, capacity=MiB)
    assert not _warnings(caplog)


def test_back_above_the_setting_clears_the_gauge_and_a_new_shortage_warns_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = BufferSpanWatch(300, every=3600, clock=clock)
    with caplog.at_level(logging.INFO, logger="databus.relay.buffer"):
        watch.check(evicted=1, span_seconds=10.0, capacity=MiB)
        assert not watch.check(evicted=1, span_seconds=400.0, capacity=MiB)
        assert not watch.short
        clock.now = 5  # well within the period: a new shortage is still told
        assert watch.check(evicted=2, span_seconds=10.0, capacity=MiB)
    assert len(_warnings(caplog)) == 2


def test_a_persistent_buffer_is_not_told_to_become_persistent() -> None:
    text = BufferSpanWatch(300, persistent=True).message(10.0, MiB)
    assert "--buffer-path" not in text and "--buffer-size" in text
