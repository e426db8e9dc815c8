"""``databus relay --buffer-path`` adopts only a buffer file (issue 13, item 2): any
other existing path is refused with one line, a non-zero exit, and left byte for
byte unchanged; a new buffer file is created 0600."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from databus.buffer.persist import HEADER_SIZE, LAYOUT_VERSION, MAGIC
from tests.support.procs import DATABUS, ROOT, free_port, running, wait_http
from tests.support.shop import TABLES


def _relay(db: Path, buffer_path: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DATABUS, "relay", "--source", f"sqlite:///{db}", "--tables", ",".join(TABLES),
         "--buffer-path", str(buffer_path), "--port", "0"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})


def _snapshot(path: Path) -> tuple[bytes, int, int]:
    st = os.stat(path)
    return path.read_bytes(), st.st_mode, st.st_mtime_ns


def _other_version(tmp: Path) -> Path:
    f = tmp / "old.buf"
    slot = MAGIC + (LAYOUT_VERSION + 1).to_bytes(4, "big")
    f.write_bytes(slot + b"\0" * (HEADER_SIZE - len(slot)) + b"\0" * 65536)
    return f


@pytest.mark.parametrize("case", ["the source database", "a symlink to it", "a directory",
                                  "another layout version", "an empty file"])
def test_a_path_that_is_not_a_buffer_is_refused_and_unchanged(shop_db: Path, tmp_path: Path,
                                                              case: str) -> None:
    target = {"the source database": lambda: shop_db,
              "a symlink to it": lambda: _symlink(tmp_path / "link.buf", shop_db),
              "a directory": lambda: _mkdir(tmp_path / "dir.buf"),
              "another layout version": lambda: _other_version(tmp_path),
              "an empty file": lambda: _touch(tmp_path / "empty.buf")}[case]()
    watched = shop_db if case == "a symlink to it" else target
    before = None if watched.is_dir() else _snapshot(watched)
    db_before = _snapshot(shop_db)
    out = _relay(shop_db, target)
    assert out.returncode != 0
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("databus: ConfigError: refusing to use")
    assert "Traceback" not in out.stderr
    if before is not None:
        assert _snapshot(watched) == before
    assert _snapshot(shop_db) == db_before
    assert not list(shop_db.parent.glob("*.corrupt-*")), "nothing moved aside"
    if case == "a symlink to it":
        assert (tmp_path / "link.buf").is_symlink()


def test_a_device_is_refused(shop_db: Path) -> None:
    out = _relay(shop_db, "/dev/null")
    assert out.returncode != 0 and "a device" in out.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_new_buffer_file_is_0600(shop_db: Path, tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "state" / "relay.buf"
    with running([*DATABUS, "relay", "--source", f"sqlite:///{shop_db}", "--tables",
                  ",".join(TABLES), "--buffer-path", str(path), "--port", str(port)],
                 tmp_path / "relay.log") as proc:
        wait_http(f"http://127.0.0.1:{port}/admin", proc)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    for state in path.parent.glob("*.json"):
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o600, state


def _symlink(link: Path, to: Path) -> Path:
    link.symlink_to(to)
    return link


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


def _touch(p: Path) -> Path:
    p.touch()
    return p
