"""A Spark standalone cluster from the venv's pyspark: a master and workers, private.

:func:`spark_cluster` starts ``spark-class org.apache.spark.deploy.master.Master`` and
``...worker.Worker`` processes (each in its own process group, with free ports, its own
work and log directories under ``tmp``, the venv's ``bin`` first on ``PATH`` as
``spark-class`` needs), waits until every worker is registered (the master's ``/json``),
and stops them all (the worker's executors with it) when the block ends.
:func:`submit` runs ``spark-submit`` against it the way a user does.

Both run from this interpreter's venv (the pinned Spark line) unless given another line's
``bin`` directory and environment (``.venv-spark42``: :mod:`tests.support.sparkline`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.procs import ROOT, free_port
from tests.support.wait import wait_until

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone cluster: ``master`` is its ``spark://`` URL."""

    master: str
    ui: str
    workers: int
    logs: Path
    worker_pids: tuple[int, ...] = ()

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and its executors (its process group), as a machine lost."""
        with suppress(ProcessLookupError):
            os.killpg(self.worker_pids[i], signal.SIGKILL)


def environment(bin_dir: Path = VENV_BIN, base: Mapping[str, str] | None = None,
                **extra: str) -> dict[str, str]:
    """The environment of the cluster's processes and of ``spark-submit``: ``base`` (this
    process's environment by default) with the venv's bin first on PATH, this checkout's
    src importable and the venv's python as PySpark's."""
    base = os.environ if base is None else base
    path = [str(ROOT / "src"), base.get("PYTHONPATH", "")]
    python = str(bin_dir / "python")
    return {**base, "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in path if p)),
            "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python, **extra}


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                cwd=log.parent, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group this module started (a worker's executors are in
    it), SIGKILL after 20 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(20)
        except ProcessLookupError:
            pass
    with suppress(ProcessLookupError, PermissionError):  # executors a worker left behind
        os.killpg(proc.pid, signal.SIGKILL)


@contextmanager
def spark_cluster(tmp: Path, workers: int = 2, cores: int = 1, memory: str = "1g", *,
                  bin_dir: Path = VENV_BIN,
                  base: Mapping[str, str] | None = None) -> Iterator[SparkCluster]:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, started
    from the Spark of ``bin_dir`` in ``base`` (see :func:`environment`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = environment(bin_dir, base, SPARK_LOG_DIR=str(tmp / "logs"),
                      SPARK_LOCAL_DIRS=str(tmp / "local"),
                      SPARK_WORKER_DIR=str(tmp / "work"), SPARK_NO_DAEMONIZE="1")
    (tmp / "logs").mkdir(exist_ok=True)
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    status = f"http://127.0.0.1:{ui}/json/"
    with ExitStack() as stack:
        m = _start([str(bin_dir / "spark-class"), "org.apache.spark.deploy.master.Master",
                    "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                   tmp / "logs" / "master.log", env)
        stack.callback(_stop, m)
        pids: list[int] = []
        for i in range(workers):
            work = tmp / f"worker{i}"
            work.mkdir(exist_ok=True)
            w = _start([str(bin_dir / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                        master, "--host", "127.0.0.1", "--port", str(free_port()),
                        "--webui-port", str(free_port()), "--cores", str(cores),
                        "--memory", memory, "--work-dir", str(work)],
                       tmp / "logs" / f"worker{i}.log", env)
            stack.callback(_stop, w)
            pids.append(w.pid)

        def registered() -> bool:
            for p in (m,):
                if p.poll() is not None:
                    raise AssertionError(f"the Spark master exited ({p.returncode}): see "
                                         f"{tmp / 'logs' / 'master.log'}")
            try:
                alive = [w for w in httpx.get(status, timeout=2).json().get("workers", [])
                         if w.get("state") == "ALIVE"]
            except (httpx.HTTPError, ValueError):
                return False
            return len(alive) >= workers

        wait_until(registered, 90, f"{workers} Spark workers to register", interval=0.5)
        yield SparkCluster(master, f"http://127.0.0.1:{ui}", workers, tmp / "logs",
                           tuple(pids))


def submit(cluster: SparkCluster, script: Path, args: Sequence[str], *,
           spark_args: Sequence[str] = (), log: Path, timeout: float = 300.0,
           env: dict[str, str] | None = None,
           bin_dir: Path = VENV_BIN) -> subprocess.CompletedProcess[str]:
    """``spark-submit --master <cluster> <spark_args> script args`` (client mode, as a user
    runs it from a shell, the ``spark-submit`` of ``bin_dir``); its output is kept in
    ``log``."""
    started = time.monotonic()
    done = subprocess.run(
        [str(bin_dir / "spark-submit"), "--master", cluster.master, *spark_args, str(script),
         *args], env=env or environment(), cwd=log.parent, capture_output=True, text=True,
        timeout=timeout, check=False)
    log.write_text(f"# {time.monotonic() - started:.1f}s, exit {done.returncode}\n"
                   f"{done.stdout}\n--- stderr ---\n{done.stderr}")
    return done
