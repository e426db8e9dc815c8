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


# -- the full mix's readers (bench only), on messages and files made by hand -----------

class _Msg:
    """A Kafka message as confluent_kafka hands it to PublishedHistory."""

    def __init__(self, topic: str, offset: int, key: object, value: object) -> None:
        self._t, self._o = topic, offset
        self._k = None if key is None else json.dumps(key).encode()
        self._v = None if value is None else json.dumps(value).encode()

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v


def _published(order: list[tuple[int, list[int]]], split: int | None = None) -> dict[str, int]:
    """What PublishedHistory makes of windows published as ``order`` says (window SCN,
    committed transactions), one transaction each, with its BEGIN/END records; the data
    topics are read up to message ``split`` first, the transaction topic after (as the
    cross-topic race does)."""
    from tests.support.soak_kafka import PublishedHistory

    h = PublishedHistory("127.0.0.1:9", "main", ["t", "u"])  # never connects here
    data: list[_Msg] = []
    txs: list[_Msg] = []
    offsets = {"soak.main.t": 0, "soak.main.u": 0, "soak.transaction": 0}

    def put(out: list[_Msg], topic: str, key: object, value: object) -> None:
        out.append(_Msg(topic, offsets[topic], key, value))
        offsets[topic] += 1

    for scn, idx in order:
        for i in idx:
            tx = COMMITTED[i]
            put(txs, "soak.transaction", {"id": tx.id}, {"status": "BEGIN", "id": tx.id})
            for n, (table, op, key) in enumerate(CHANGES[i], 1):
                put(data, f"soak.main.{table}", {"id": json.loads(key)}, {
                    "op": op, "source": {"scn": scn, "gtid": tx.id, "table": table},
                    "transaction": {"id": tx.id, "total_order": n}})
            put(txs, "soak.transaction", {"id": tx.id},
                {"status": "END", "id": tx.id, "event_count": len(CHANGES[i])})
    for m in [*data, *txs][:split]:
        h._pos.setdefault((m.topic(), 0), 0)
        h._one(m)
    h._hand_over(False)
    for m in [*data, *txs][split:] if split is not None else []:
        h._pos.setdefault((m.topic(), 0), 0)
        h._one(m)
    h._hand_over(True)
    r = check_history(h.windows, COMMITTED)
    return {"lost": r["lost"], "torn": r["torn"], "duplicated": r["duplicated"],
            "reordered": r["reordered"] + h.reordered, "copies": h.copies}


def test_the_kafka_reader_rebuilds_windows_and_finds_copies_and_reorders() -> None:
    none = {"lost": 0, "torn": 0, "duplicated": 0, "reordered": 0, "copies": 0}
    assert _published([(10, [0]), (20, [1]), (30, [2])]) == none
    # a window visible in one data topic before the others, or before its END: waits
    assert _published([(10, [0]), (20, [1]), (30, [2])], split=3) == none
    assert _published([(10, [0]), (20, [1]), (30, [2])], split=1) == none
    assert _published([(10, [0]), (30, [2])])["lost"] == 1
    copy = _published([(10, [0]), (20, [1]), (10, [0]), (30, [2])])
    assert copy["duplicated"] == 1 and copy["copies"] == 1 and copy["reordered"] >= 1
    assert _published([(10, [0]), (30, [2]), (20, [1])])["reordered"] >= 1


def _sink_file(out: Path, name: str, spec: list[tuple[int, list[int]]]) -> str:
    """A Parquet file as Spark's sink writes it into ``out``: the windows of ``spec``
    (SCN, the committed transactions by index), one row per change."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.support.soak_spark import COLUMNS

    rows = [(scn, n, table, COMMITTED[i].id, op, key) for scn, idx in spec
            for n, (i, (table, op, key)) in enumerate((i, c) for i in idx for c in CHANGES[i])]
    path = out / f"part-{name}.parquet"
    pq.write_table(pa.table({c: [r[k] for r in rows] for k, c in enumerate(COLUMNS)}), path)
    return str(path)


def _sink_log(out: Path, name: str, *paths: str) -> None:
    """Entry ``name`` (a batch number, or ``N.compact``) of the sink log, adding ``paths``."""
    log = out / "_spark_metadata"
    log.mkdir(exist_ok=True)
    (log / name).write_text("v1\n" + "".join(
        json.dumps({"path": f"file://{p}", "action": "add"}) + "\n" for p in paths))


def test_the_spark_reader_reads_only_the_files_the_sink_log_lists(tmp_path: Path) -> None:
    from tests.support.soak_spark import SparkHistory

    _sink_log(tmp_path, "0", _sink_file(tmp_path, "a", [(10, [0]), (20, [1])]))
    _sink_file(tmp_path, "killed", [(30, [2])])  # a batch killed before its log entry
    h = SparkHistory(tmp_path)
    assert counts(h.read()) == {**ZERO, "lost": 1}
    _sink_log(tmp_path, "1", _sink_file(tmp_path, "b", [(30, [2])]))
    assert counts(h.read(final=True)) == ZERO and h.uncommitted == 1 and h.copies == 0
    _sink_log(tmp_path, "2", _sink_file(tmp_path, "c", [(20, [1])]))  # a batch's windows twice
    assert counts(h.read())["duplicated"] == 1 and h.copies == 1


def test_the_spark_reader_reads_a_compacted_log_in_batch_order(tmp_path: Path) -> None:
    """Spark's sink log after a compaction: ``2.compact`` holds batches 0-2 (batch 2
    wrote no file), the file of batch 1 is not deleted yet, batch 3 follows. Read in
    batch order, nothing is out of order or read twice (read before the compact file,
    batch 1 came ahead of batch 0, and a 30-minute soak counted every later window
    reordered so)."""
    from tests.support.soak_spark import SparkHistory

    a, b = _sink_file(tmp_path, "a", [(10, [0])]), _sink_file(tmp_path, "b", [(20, [1])])
    _sink_log(tmp_path, "1", b)
    _sink_log(tmp_path, "2.compact", a, b)
    _sink_log(tmp_path, "3", _sink_file(tmp_path, "c", [(30, [2])]))
    h = SparkHistory(tmp_path)
    assert counts(h.read(final=True)) == ZERO and h.copies == 0
    assert [w[0] for w in h.windows] == [10, 20, 30]


def test_a_query_whose_first_commits_spark_deleted_has_committed(tmp_path: Path) -> None:
    """The soak kills the Spark driver only once its query committed a batch; Spark keeps
    the newest 100 commit files, so ``commits/0`` is gone later in a long run and the
    newer ones count (a 30-minute run waited 600 s for ``commits/0`` and stopped)."""
    from tests.support.soak_spark import first_batch_committed

    ckpt = tmp_path / "ckpt"
    assert not first_batch_committed(ckpt)
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "commits" / ".0.crc").write_text("")
    assert not first_batch_committed(ckpt)
    (ckpt / "commits" / "305").write_text("v1\n")
    assert first_batch_committed(ckpt)
