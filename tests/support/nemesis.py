"""A nemesis: faults picked at random (seeded) and healed, one at a time, for a while.

The topology hands it, per fault *kind*, the *targets* it may hit and what hitting one
means: a callable ``fault(target, seconds)`` that injects the fault, keeps it for
``seconds`` and heals it (restarts what it killed, resumes what it paused, removes the
cut, frees the disk) before returning. The nemesis then loops until its time is up:

* it deals the kinds in rounds, each round a seeded shuffle of every kind, so that a
  short run still injects every kind (a uniform draw could leave one out); the target
  within a kind and the fault's length (``hold``, seconds) are drawn from the same
  seeded generator;
* between two faults it waits a random ``gap``;
* every fault is logged (:attr:`Nemesis.log`: start time since the run's start, kind,
  target, seconds held, seconds until healed) and counted (:attr:`Nemesis.counts`).

Faults never overlap: each heals before the next begins, so what the checker finds
after a run can be traced to the faults in the log. A fault that raises stops the
nemesis and the exception is raised again by :meth:`Nemesis.stop` (a harness that
cannot heal its own fault must fail the run, not carry on half-broken).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Fault = Callable[[str, float], None]


@dataclass(frozen=True)
class Kind:
    """One fault kind: its name, the targets it may hit, and how (see module doc)."""

    name: str
    targets: Sequence[str]
    fault: Fault


@dataclass(frozen=True)
class Injected:
    at: float  # seconds since the nemesis started
    kind: str
    target: str
    hold: float  # seconds the fault was kept
    healed_after: float  # seconds from injection to healed (hold + the heal itself)

    def line(self) -> str:
        return (f"{self.at:7.1f}s {self.kind:<16} {self.target:<12} held {self.hold:4.1f}s,"
                f" healed after {self.healed_after:4.1f}s")


@dataclass
class Nemesis:
    """See the module docstring. ``hold`` and ``gap``: (min, max) seconds."""

    kinds: Sequence[Kind]
    seed: int
    hold: tuple[float, float] = (1.0, 4.0)
    gap: tuple[float, float] = (0.5, 2.0)
    say: Callable[[str], None] = print
    log: list[Injected] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Faults injected per kind (every kind present, 0 when it never ran)."""
        c = Counter(i.kind for i in self.log)
        return {k.name: c.get(k.name, 0) for k in self.kinds}

    def run(self, seconds: float) -> None:
        """Inject faults for ``seconds`` in this thread (the last one may end later:
        a fault is always healed)."""
        rng = random.Random(self.seed)
        t0 = time.monotonic()
        deck: list[Kind] = []
        self.say(f"nemesis: seed {self.seed}, {seconds:g} s, kinds "
                 f"{', '.join(k.name for k in self.kinds)}")
        while not self._stop.is_set() and time.monotonic() - t0 < seconds:
            if not deck:
                deck = list(self.kinds)
                rng.shuffle(deck)
            kind = deck.pop()
            target = rng.choice(list(kind.targets))
            hold = round(rng.uniform(*self.hold), 2)
            gap = rng.uniform(*self.gap)
            at = time.monotonic()
            kind.fault(target, hold)
            done = Injected(round(at - t0, 2), kind.name, target, hold,
                            round(time.monotonic() - at, 2))
            self.log.append(done)
            self.say(f"nemesis: {done.line()}")
            self._stop.wait(gap)

    def start(self, seconds: float) -> None:
        """:meth:`run` on a thread; :meth:`stop` ends it."""
        def body() -> None:
            try:
                self.run(seconds)
            except BaseException as exc:  # re-raised by stop()
                self._error = exc

        self._thread = threading.Thread(target=body, name="nemesis", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the run's time is up and its last fault healed."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"the nemesis failed (seed {self.seed}): {self._error!r}"
                               ) from self._error

    def stop(self) -> None:
        """End the run after the fault in progress heals; raise what a fault raised."""
        self._stop.set()
        self.wait()
