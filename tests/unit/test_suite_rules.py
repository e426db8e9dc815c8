"""Rules of the test suite itself: tests read shared helpers from tests/support (never
from another test module), and nothing reaches a fixed database port (every server is
private, on a free port)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXED_PORT = re.compile(r"(?:127\.0\.0\.1|localhost|\]):(?:5432|3306)\b|port\s*=\s*(?:5432|3306)\b")


def _modules() -> list[Path]:
    return sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])


def test_no_test_module_imports_another() -> None:
    bad = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == "tests" and (parts[-1].startswith("test_")
                                            or parts[-1] == "conftest"):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert not bad, "move shared helpers to tests/support:\n" + "\n".join(bad)


def test_no_module_names_a_fixed_database_port() -> None:
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
           for p in _modules() if p.name != "test_suite_rules.py"
           for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           if FIXED_PORT.search(line)]
    assert not bad, "use the suite's private servers (tests/conftest.py):\n" + "\n".join(bad)


def test_the_suite_measures_count_what_they_name(tmp_path: Path) -> None:
    from tests.support.measures import measures

    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    (tmp_path / "tests" / "support").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text("m = MariaDB(x)\np = PostgreSQL()\n")
    (tmp_path / "tests" / "e2e" / "test_a.py").write_text(
        "import time\nfrom time import sleep\n"
        "class P(ProcessPipeline):\n    pass\n"
        "class R(RelayPipeline):\n    pass\n"
        "cmd = [*DATABUS, 'relay', '--config', c]\nother = [*DATABUS, 'replicate']\n"
        "def test_x():\n    time.sleep(1)\n    sleep(2)\n    done.wait(3)\n"
        "    with MariaDB(d) as m:\n        pass\n")
    (tmp_path / "tests" / "support" / "helpers.py").write_text(
        "import time\nclass Q(ProcessPipeline):\n    pass\ntime.sleep(1)\nMariaDB(d)\n")
    got = {k: dict(v) for k, v in measures(tmp_path).items()}
    assert got == {
        "fixed time.sleep calls outside tests/support": {"tests/e2e/test_a.py": 2},
        "places that build a private MariaDB": {"tests/e2e/test_a.py": 1},
        "places that build a private PostgreSQL": {},
        "process harnesses (ProcessPipeline, RelayPipeline subclasses)": {
            "tests/e2e/test_a.py": 2, "tests/support/helpers.py": 1},
        "relay command lines spelled out of tests/support/pipeline.py": {
            "tests/e2e/test_a.py": 1},
    }
