"""bench/RESULTS.md's summary table covers every benchmark, and its links lead somewhere.

* every module of ``bench/`` and ``bench/peers/`` (but the packages' ``__init__``) is named
  as ``bench.<module>`` in the first column of some row of the table;
* every link in the table (``results/<file>.md``, with or without ``#anchor``) names a
  file that exists, and an anchor names a heading of that file (GitHub's heading ids);
* every history file under ``bench/results/`` is linked from the table, so none is lost.

The table is the first Markdown table of RESULTS.md; its first column holds the modules.
"""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
RESULTS = BENCH / "RESULTS.md"
LINK = re.compile(r"\]\((results/[^)#\s]+)(?:#([^)\s]+))?\)")
MODULE = re.compile(r"`(bench(?:\.peers)?\.\w+)`")


def _modules() -> set[str]:
    found = set()
    for pkg in (BENCH, BENCH / "peers"):
        prefix = "bench." if pkg == BENCH else "bench.peers."
        found |= {prefix + p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    return found


def _rows(text: str) -> list[str]:
    """The body rows of the first table: the lines from its delimiter row on, while they are rows."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _first_cell(row: str) -> str:
    return row.split("|")[1]


def _slug(heading: str) -> str:
    """GitHub's id of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6} (.*)", line)
        if match:
            base = _slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            anchors.add(base if n == 0 else f"{base}-{n}")
    return anchors


def test_the_table_has_rows() -> None:
    rows = _rows(RESULTS.read_text())
    assert len(rows) >= len(_modules()), "the summary table is missing or cut short"
    assert all(row.count("|") >= 9 for row in rows), "a row with fewer than 8 columns"


def test_every_bench_module_has_a_row() -> None:
    named = {m for row in _rows(RESULTS.read_text()) for m in MODULE.findall(_first_cell(row))}
    missing = sorted(_modules() - named)
    assert not missing, f"bench modules without a row in bench/RESULTS.md: {missing}"


def test_every_link_of_the_table_resolves() -> None:
    broken = []
    for row in _rows(RESULTS.read_text()):
        for target, anchor in LINK.findall(row):
            path = RESULTS.parent / target
            if not path.is_file():
                broken.append(target)
            elif anchor and anchor not in _anchors(path):
                broken.append(f"{target}#{anchor}")
    assert not broken, f"links in bench/RESULTS.md's table that lead nowhere: {sorted(set(broken))}"


def test_every_history_file_is_linked() -> None:
    linked = {target for row in _rows(RESULTS.read_text()) for target, _ in LINK.findall(row)}
    files = {f"results/{p.name}" for p in (BENCH / "results").glob("*.md")}
    assert files, "bench/results/ holds no history file"
    assert not files - linked, f"history files no row links: {sorted(files - linked)}"
