"""The randomized soak (issue 35), paced: about two minutes of faults picked at random
while sysbench's ``oltp_write_only`` writes MariaDB (a two-member relay cluster, a chain
relay behind it) and a writer writes PostgreSQL (a relay whose state is on a small
tmpfs), with ``replicate`` and recorders on every relay. Then every recorder's history
must hold every committed transaction once, in order, whole (duplicates only as whole
windows replayed), and every replica must equal its source. See
``tests/support/soak.py`` for what "committed" is read from and how.

The seed is fixed (35); ``DATABUS_SOAK_SEED=N`` runs another, and every failure message
names the seed that found it. The checker itself is tested first, on histories made by
hand, so that a soak that passes is known to be able to fail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.soak import Settings, run_soak, unavailable
from tests.support.soak_check import Change, Tx, Window, check_history, rows_text

SEED = int(os.environ.get("DATABUS_SOAK_SEED", "35"))

CHANGES: list[list[Change]] = [[("t", "c", "1"), ("t", "c", "2")], [("t", "u", "1")],
                               [("t", "d", "2"), ("u", "c", "7")]]
COMMITTED = [Tx(f"0-1-{i + 1}", rows_text(c)) for i, c in enumerate(CHANGES)]


def windows(*spec: tuple[int, list[int]]) -> list[Window]:
    """Windows holding the committed transactions named by index."""
    return [(scn, tuple(COMMITTED[i].id for i in txs),
             rows_text([c for i in txs for c in CHANGES[i]])) for scn, txs in spec]


def counts(history: list[Window]) -> dict[str, int]:
    r = check_history(history, COMMITTED)
    return {k: r[k] for k in ("lost", "torn", "reordered", "duplicated", "phantom")}


ZERO = {"lost": 0, "torn": 0, "reordered": 0, "duplicated": 0, "phantom": 0}


def test_the_checker_passes_an_exact_history_and_counts_replayed_windows() -> None:
    assert counts(windows((10, [0]), (20, [1]), (30, [2]))) == ZERO
    assert counts(windows((10, [0, 1]), (30, [2]))) == ZERO  # several transactions: whole
    replay = windows((10, [0]), (20, [1]), (10, [0]), (20, [1]), (30, [2]))
    assert counts(replay) == {**ZERO, "duplicated": 2}


def test_the_checker_finds_loss_tears_reorders_and_phantoms() -> None:
    assert counts(windows((10, [0]), (30, [2]))) == {**ZERO, "lost": 1}
    torn = windows((10, [0]), (20, [1]), (30, [2]))
    torn[2] = (30, torn[2][1], rows_text(CHANGES[2][:1]))  # half of a transaction
    assert counts(torn) == {**ZERO, "torn": 1}
    assert counts(windows((10, [0]), (30, [2]), (20, [1])))["reordered"] == 2
    assert counts(windows((10, [0]), (20, [2]), (30, [1])))["reordered"] == 1
    assert counts(windows((10, [0]), (20, [0, 2])))["torn"] == 1  # not consecutive
    other = windows((10, [0]), (20, [1]), (30, [2]))
    other.append((20, other[1][1], rows_text([("t", "u", "2")])))  # same SCN, other rows
    assert counts(other) == {**ZERO, "torn": 1}
    assert counts([*windows((10, [0]), (20, [1]), (30, [2])),
                   (40, ("0-1-9",), rows_text([("t", "c", "9")]))]) == {**ZERO, "phantom": 1}


@pytest.mark.slow
def test_a_paced_soak_loses_tears_and_reorders_nothing(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    report = run_soak(tmp_path, Settings(seed=SEED, seconds=110.0), say=say)
    summary = json.dumps({k: report[k] for k in ("committed", "recorders", "replicates",
                                                 "faults", "died")}, indent=1)
    where = f"seed {SEED} (DATABUS_SOAK_SEED={SEED} runs it again); faults:\n" + "\n".join(
        report["fault_log"]) + f"\n{summary}"
    missing = [k for k, n in report["faults"].items() if n == 0]
    assert not missing, f"fault kinds never injected: {missing}; {where}"
    assert report["ok"], f"the soak found a problem with {where}"
    for name, r in report["recorders"].items():
        assert r["windows"] > 0, f"{name} recorded nothing; {where}"
    assert min(report["committed"].values()) > 500, f"the writers hardly wrote; {where}"
    print(f"soak seed {SEED}: {report['committed']} transactions checked, faults"
          f" {report['faults']}, duplicates "
          f"{ {n: r['duplicated'] for n, r in report['recorders'].items()} },"
          f" {report['wall_s']} s")
