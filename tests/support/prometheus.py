"""A private Prometheus server for tests: Debian's ``prometheus`` binary on a free
loopback port, its config and TSDB in a temp dir, scraping the given targets every
second, stopped after (``with prometheus(...) as url``). ``PROMETHEUS``/``PROMTOOL`` are
None when the package is not installed (scripts/setup.sh installs it with
DATABUS_SETUP_SERVERS=1)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import free_port, stop
from tests.support.wait import wait_until

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


@contextmanager
def prometheus(tmp: Path, jobs: dict[str, list[str]], *,
               rule_files: Sequence[Path] = ()) -> Iterator[str]:
    """Prometheus scraping ``jobs`` (job name -> ``host:port`` targets) every second and
    evaluating ``rule_files`` every second; yields its URL once it is ready."""
    assert PROMETHEUS, "prometheus is not installed"
    tmp.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                           for job, targets in jobs.items()],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"prometheus exited {proc.returncode}: "
                                         f"{(tmp / 'prometheus.log').read_text()[-2000:]}")
                try:
                    return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False
            wait_until(ready, 30, "prometheus ready")
            yield url
        finally:
            stop(proc)


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """The result of an instant query; an error answer (a bad expression) fails with
    Prometheus' message."""
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body.get("status") == "success", \
        f"{expr!r}: {r.status_code} {body.get('errorType')}: {body.get('error')}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result
