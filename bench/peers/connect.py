"""Debezium -> Kafka the way it is deployed: a Kafka Connect worker in standalone mode
running Debezium's MySQL connector, producing into a Kafka broker.

The worker is Kafka's own ``org.apache.kafka.connect.cli.ConnectStandalone`` (connect-runtime
4.1.0) with the connector 3.3.1.Final, both from the pinned bundle
``scripts/java/debezium.pom.xml`` (the jars the embedded harness uses: Debezium's engine is
built on connect-runtime, so the bundle holds the whole Connect worker). No class of ours
runs in that JVM. Values and keys go through Kafka Connect's ``JsonConverter`` with
``schemas.enable=true`` (Connect's default), so each message is what a Debezium user reads.

:class:`Connect` writes ``worker.properties`` and ``connector.properties`` into its working
directory (offsets and schema history are files there, so a second worker resumes where the
first stopped), starts the JVM, and stops it with SIGTERM, which makes Connect commit its
offsets; the REST listener is on a free loopback port. Topics are ``<prefix>.<db>.<table>``
plus the control table ``peerctl.mark`` of :mod:`bench.peers.harness`; the broker creates
them (``auto.create.topics.enable``). Connect is at least once: its producer is not
transactional (exactly-once source support needs distributed mode).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
from tests.support.mariadb import MariaDB
from tests.support.procs import free_port

CONTROL = "peerctl.mark"
NAME = "dbz-mysql"


class Connect:
    """One standalone Connect worker running the MySQL connector (module docstring).

    ``tables`` is Debezium's ``table.include.list`` (the control table is added);
    ``extra`` overrides connector properties (``poll.interval.ms``, ...); ``worker``
    overrides worker properties (``producer.linger.ms``, ...).
    """

    def __init__(self, m: MariaDB, bootstrap_servers: str, workdir: Path, cp: str, *,
                 tables: str, prefix: str = "dbz", heap: str | None = None,
                 extra: dict[str, str] | None = None,
                 worker: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.prefix = prefix
        self.rest = f"http://127.0.0.1:{free_port()}"
        worker_props = {
            "bootstrap.servers": bootstrap_servers,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": str(workdir / "connect.offsets"),
            # Connect's default is 60 s; a stop (SIGTERM) commits them anyway
            "offset.flush.interval.ms": "1000",
            "listeners": self.rest,
            "plugin.discovery": "only_scan",  # the connector is on the classpath, no plugin.path
            **(worker or {}),
        }
        connector_props = {
            "name": NAME,
            "connector.class": "io.debezium.connector.mysql.MySqlConnector",
            "tasks.max": "1",
            "database.hostname": "127.0.0.1",
            "database.port": str(m.port),
            "database.user": "root",
            "database.password": "",
            "database.server.id": "5401",
            "topic.prefix": prefix,
            "table.include.list": f"{tables},{CONTROL}" if tables else CONTROL,
            "snapshot.mode": "no_data",
            "include.schema.changes": "false",
            "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
            "schema.history.internal.file.filename": str(workdir / "history.dat"),
            **(extra or {}),
        }
        for name, props in (("worker", worker_props), ("connector", connector_props)):
            (workdir / f"{name}.properties").write_text(
                "".join(f"{k}={v}\n" for k, v in props.items()))
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not installed: run `bash scripts/setup.sh`")
        args = [java, *([f"-Xmx{heap}"] if heap else []),
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp", cp, "org.apache.kafka.connect.cli.ConnectStandalone",
                str(workdir / "worker.properties"), str(workdir / "connector.properties")]
        self.log = (workdir / "connect.log").open("ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_running(self, timeout: float = 180.0) -> None:
        """Until the REST API reports the connector and its task RUNNING."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka Connect exited with {self.proc.returncode}:"
                                   f" see {self.workdir / 'connect.log'}")
            try:
                r = httpx.get(f"{self.rest}/connectors/{NAME}/status", timeout=2)
                st = r.json() if r.status_code == 200 else {}
                tasks = st.get("tasks") or []
                if st.get("connector", {}).get("state") == "RUNNING" and tasks:
                    if tasks[0].get("state") == "FAILED":
                        raise RuntimeError(f"the Debezium task failed: {tasks[0].get('trace')}")
                    if tasks[0].get("state") == "RUNNING":
                        return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kafka Connect did not run the connector in {timeout}s")
            time.sleep(0.3)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (Connect stops the task and commits its offsets), SIGKILL after
        ``timeout``."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            self.log.close()
