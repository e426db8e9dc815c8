"""Faults a production deployment meets, made with real mechanisms: packets dropped
silently (nftables) and a file system that fills up (a size-limited tmpfs).

**Silent cuts.** ``with cut(port):`` drops, without a reset or a FIN, every TCP packet
to ``127.0.0.1:port`` (``direction="to"``: ``tcp dport``), from it (``"from"``:
``tcp sport``) or both (the default); leaving the block heals the cut. A connect to a
cut port times out instead of being refused; a connected socket's reads wait and its
sends fill the kernel's buffer and then wait, as across a dead switch. (The forwarder
in ``netcut`` is the other kind of failure: a reset, seen at once.)

The rules live in a table of this process's own, ``inet databus_faults_<pid>``, in an
``output`` hook chain whose every rule matches ``ip daddr 127.0.0.1`` first: no other
address, no other table is ever touched. The table is made on the first cut, deleted
when the process exits, and a table left by a process that died (its pid no longer
running) is deleted when the next one is made.

**Full disks.** ``with small_disk(size) as path:`` mounts a tmpfs of ``size`` bytes on
a new directory (unmounted and removed after); ``with filled(path, leave=n):`` writes a
filler file until ``n`` bytes are left free on that file system, and deletes it at the
block's end (space returns); ``free_bytes(path)`` says how much is free now.

Both need root (``CAP_NET_ADMIN``, ``CAP_SYS_ADMIN``) and ``nft``/``mount``:
:func:`nft_unavailable` and :func:`mount_unavailable` return why not (a test skips with
that reason), or None.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Literal

Direction = Literal["both", "to", "from"]

PREFIX = "databus_faults_"
TABLE = f"{PREFIX}{os.getpid()}"
LOOPBACK = "127.0.0.1"  # the only address a rule ever names

_lock = threading.Lock()
_made = False


def _nft_binary() -> str | None:
    return shutil.which("nft") or ("/usr/sbin/nft" if Path("/usr/sbin/nft").exists() else None)


def _nft(*args: str) -> str:
    """Run ``nft args`` (``-e -a``: echo the rule with its handle); its own words on
    failure."""
    nft = _nft_binary()
    if nft is None:
        raise RuntimeError("nft is not installed: run `bash scripts/setup.sh` "
                           "(it installs Debian's nftables)")
    done = subprocess.run([nft, *args], capture_output=True, text=True, timeout=30,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)} exited with {done.returncode}: "
                           f"{done.stderr.strip()}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, someone else's
        return True
    return True


def _remove_stale() -> None:
    """Delete the tables of suite processes that no longer run (killed before exit)."""
    for name in re.findall(r"table inet (" + PREFIX + r"\d+)", _nft("list", "tables")):
        pid = int(name[len(PREFIX):])
        if pid != os.getpid() and not _pid_alive(pid):
            with suppress(RuntimeError):  # another process removed it first
                _nft("delete", "table", "inet", name)


def _delete_table() -> None:
    global _made
    with _lock:
        if _made:
            with suppress(RuntimeError):
                _nft("delete", "table", "inet", TABLE)
            _made = False


def _ensure_table() -> None:
    global _made
    with _lock:
        if _made:
            return
        _remove_stale()
        _nft("add", "table", "inet", TABLE)
        atexit.register(_delete_table)
        _made = True
        _nft("add", "chain", "inet", TABLE, "output",
             "{ type filter hook output priority 0 ; policy accept ; }")


def nft_unavailable() -> str | None:
    """Why this process cannot cut ports (not root, no nft, nf_tables refused), or None."""
    if os.geteuid() != 0:
        return "silent cuts need root (nftables rules): run the suite as root"
    if _nft_binary() is None:
        return "nft is not installed (scripts/setup.sh installs nftables)"
    try:
        _ensure_table()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"nftables refused this process's table: {exc}"
    return None


def _add_rule(match: str, port: int) -> int:
    out = _nft("-e", "-a", "add", "rule", "inet", TABLE, "output",
               "ip", "daddr", LOOPBACK, "tcp", match, str(port), "drop")
    found = re.search(r"# handle (\d+)", out)
    if found is None:
        raise RuntimeError(f"nft did not echo the handle of the rule it added: {out!r}")
    return int(found.group(1))


def rules() -> str:
    """This process's rules now, as nft lists them (for a test's post-mortem)."""
    return _nft("-a", "list", "table", "inet", TABLE) if _made else ""


@contextmanager
def cut(port: int, direction: Direction = "both") -> Iterator[None]:
    """Drop TCP packets to and/or from ``127.0.0.1:port`` silently while the block
    runs (see the module docstring). ``port`` is one a server listens on (so no other
    local socket has it as its own: a ``from`` rule matches every packet sent from it)."""
    if direction not in ("both", "to", "from"):
        raise ValueError(f"direction must be both, to or from, not {direction!r}")
    if not 0 < port < 65536:
        raise ValueError(f"not a TCP port: {port}")
    _ensure_table()
    matches = {"both": ("dport", "sport"), "to": ("dport",), "from": ("sport",)}[direction]
    handles: list[int] = []
    try:
        for match in matches:
            handles.append(_add_rule(match, port))
        yield
    finally:
        for handle in handles:
            _nft("delete", "rule", "inet", TABLE, "output", "handle", str(handle))


def mount_unavailable() -> str | None:
    """Why this process cannot mount a small tmpfs (not root, no mount), or None."""
    if os.geteuid() != 0:
        return "a small disk needs root (mount -t tmpfs): run the suite as root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount are not installed"
    return None


@contextmanager
def small_disk(size: int) -> Iterator[Path]:
    """A new directory with a tmpfs of ``size`` bytes mounted on it (see the module
    docstring); unmounted and removed at the block's end."""
    root = Path(tempfile.mkdtemp(prefix="databus-small-disk-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755",
                           "databus_faults", str(root)],
                          capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        root.rmdir()
        raise RuntimeError(f"mount -t tmpfs size={size} on {root} failed: "
                           f"{done.stderr.strip()}")
    try:
        yield root
    finally:
        # lazy: a process the test failed to stop must not leave the mount behind
        subprocess.run(["umount", "-l", str(root)], capture_output=True, timeout=30,
                       check=False)
        with suppress(OSError):
            root.rmdir()


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged write may still use on ``path``'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@contextmanager
def filled(path: Path, leave: int = 0) -> Iterator[Path]:
    """Fill ``path``'s file system until ``leave`` bytes are free (a filler file in
    ``path``), and delete the filler at the block's end: the space returns."""
    filler = path / ".databus-filler"
    chunk = b"\0" * (1 << 20)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        try:  # unbuffered: nothing left in a buffer to fail again at close
            while (room := free_bytes(path) - leave) > 0:
                os.write(fd, chunk[:min(room, len(chunk))])
        except OSError:  # full earlier than statvfs said (blocks, metadata)
            pass
        finally:
            os.close(fd)
        yield filler
    finally:
        with suppress(FileNotFoundError):
            filler.unlink()
