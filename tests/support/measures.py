"""The test suite's own measures (issue 31), read from the source text: cheap, no test runs.

    python -m tests.support.measures        (scripts/test.sh prints them before pytest)

* fixed sleeps: ``time.sleep(...)`` calls in tests outside tests/support (a wait for a
  state belongs in ``wait.wait_until``; what stays is workload pacing, chaos intervals
  and durations a test is about);
* places (tests and their fixtures) that build a private server (``MariaDB(...)``,
  ``PostgreSQL(...)``) rather than use the session's: each server copies a data
  directory installed once per process (tests/support/mariadb.py, postgres.py), none
  runs ``mariadb-install-db`` or ``initdb`` of its own;
* process harnesses (subclasses of ``ProcessPipeline`` or ``RelayPipeline``), and the
  ``databus relay`` command lines spelled out (``[*DATABUS, "relay", ...]``) anywhere but
  in tests/support/pipeline.py's ``relay_args``.

The suite's wall and CPU time are printed by scripts/test.sh itself.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "support" not in p.relative_to(folder).parts)


def _calls(path: Path, name: str, attr_of: str | None = None) -> int:
    """Calls of ``attr_of.name(...)`` (or of a bare ``name(...)`` when ``attr_of`` is None,
    or when ``name`` was imported from ``attr_of``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bare = attr_of is None or any(
        isinstance(n, ast.ImportFrom) and n.module == attr_of
        and any(a.name == name and a.asname is None for a in n.names) for n in ast.walk(tree))
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == name and isinstance(f.value, ast.Name)
                and f.value.id == attr_of) or (bare and isinstance(f, ast.Name) and f.id == name):
            count += 1
    return count


def _subclasses(path: Path, bases: tuple[str, ...]) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
               and n.name not in bases
               and any(isinstance(b, ast.Name) and b.id in bases for b in n.bases))


def _relay_command_lines(path: Path) -> int:
    """List displays ``[*DATABUS, "relay", ...]``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.List) and len(n.elts) > 1
               and isinstance(n.elts[0], ast.Starred) and isinstance(n.elts[0].value, ast.Name)
               and n.elts[0].value.id == "DATABUS" and isinstance(n.elts[1], ast.Constant)
               and n.elts[1].value == "relay")


def measures(root: Path = ROOT) -> dict[str, Counter[str]]:
    """Each measure: its count per file (relative to ``root``), files with none left out."""
    tests = root / "tests"
    out: dict[str, Counter[str]] = {
        "fixed time.sleep calls outside tests/support": Counter(),
        "places that build a private MariaDB": Counter(),
        "places that build a private PostgreSQL": Counter(),
        "process harnesses (ProcessPipeline, RelayPipeline subclasses)": Counter(),
        "relay command lines spelled out of tests/support/pipeline.py": Counter(),
    }
    for path in _modules(tests):
        rel = str(path.relative_to(root))
        for key, n in (
                ("fixed time.sleep calls outside tests/support", _calls(path, "sleep", "time")),
                ("places that build a private MariaDB", _calls(path, "MariaDB")),
                ("places that build a private PostgreSQL", _calls(path, "PostgreSQL"))):
            if n and rel != "tests/conftest.py":  # not the session's shared servers
                out[key][rel] += n
    for path in sorted(tests.rglob("*.py")):
        rel = str(path.relative_to(root))
        n = _subclasses(path, ("ProcessPipeline", "RelayPipeline"))
        if n:
            out["process harnesses (ProcessPipeline, RelayPipeline subclasses)"][rel] += n
        n = _relay_command_lines(path)
        if n and rel != "tests/support/pipeline.py":
            out["relay command lines spelled out of tests/support/pipeline.py"][rel] += n
    return out


def main() -> None:
    for key, per_file in measures().items():
        top = ", ".join(f"{f.removeprefix('tests/')} {n}" for f, n in per_file.most_common(5))
        print(f"{key}: {sum(per_file.values())}" + (f" (most: {top})" if top else ""))


if __name__ == "__main__":
    main()
