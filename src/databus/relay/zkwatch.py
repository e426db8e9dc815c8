"""What a relay cluster member knows of ZooKeeper, answered without waiting on it.

:class:`ZkWatch` serves two questions of :mod:`databus.relay.cluster`:

* **Reachable?** :meth:`ZkWatch.down_for` is how long the member's ZooKeeper
  connection has been down (0 while connected). It is sampled by the member's own
  thread at least once a second and by every status read. Past the session timeout
  (:meth:`ZkWatch.unreachable`) the member can no longer know whether it still leads
  or whether its leader still does: a leader publishes nothing (its fencing already
  waits), and the member says so: ``/health/ready`` 503 (check ``cluster``), ``/admin``
  ``degraded`` 503, ``zookeeper.unreachable_seconds`` in ``/admin``'s cluster
  section, and one warning in its log. It recovers by itself when the connection
  returns (the session alive: it goes on in its role; expired: it follows, as after
  any lost session).
* **The cluster as ZooKeeper shows it** (``/admin``'s ``view``): read on a thread of
  its own with a 2 s deadline per read, at most once a second; a status read waits
  for a refresh at most :data:`VIEW_WAIT` seconds and otherwise answers the last view
  read, with its age (``view_age_seconds``) and the last error (``view_error``). So
  ``/admin`` answers within a second even while ZooKeeper is unreachable (it used to
  wait for the read's 10 s timeout).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from databus.coord import ClusterView
from databus.core.errors import CoordinatorUnavailableError

if TYPE_CHECKING:
    from databus.coord import MemberNodes

VIEW_WAIT = 0.5  # seconds a status read waits for a fresh view
VIEW_READ_TIMEOUT = 2.0  # seconds each ZooKeeper read of the view may take
VIEW_EVERY = 1.0  # seconds between view reads (/containerStats and /admin are polled)


class ZkWatch:
    """See the module docstring."""

    def __init__(self, session_timeout: float) -> None:
        self.session_timeout = session_timeout
        self._nodes: MemberNodes | None = None
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._warned = False
        self._view: dict[str, Any] = {}
        self._view_at = float("-inf")  # monotonic time of the last successful read
        self._tried_at = float("-inf")
        self._reading: threading.Thread | None = None

    def attach(self, nodes: MemberNodes) -> None:
        self._nodes = nodes

    # -- reachable? -------------------------------------------------------------

    def down_for(self) -> float:
        """Seconds the connection has been down now (0: connected or not started)."""
        nodes = self._nodes
        if nodes is None:
            return 0.0
        now = time.monotonic()
        with self._lock:
            if nodes.session.connected:
                self._down_since = None
                self._warned = False
                return 0.0
            if self._down_since is None:
                self._down_since = now
            return now - self._down_since

    def unreachable(self) -> bool:
        """Down longer than the session timeout (see the module docstring)."""
        return self.down_for() > self.session_timeout

    def warn_once(self) -> bool:
        """True the first time :meth:`unreachable` holds in one outage (log it once)."""
        if not self.unreachable():
            return False
        with self._lock:
            first, self._warned = not self._warned, True
        return first

    # -- the cluster's view ------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """``view`` (the last read), ``view_age_seconds``, ``view_error`` when the last
        read failed, and ``zookeeper`` (connected, unreachable_seconds)."""
        nodes = self._nodes
        if nodes is None:
            return {}
        with self._lock:
            now = time.monotonic()
            if now - self._tried_at >= VIEW_EVERY and self._reading is None:
                self._tried_at = now
                self._reading = threading.Thread(
                    target=self._read, args=(nodes,), name="databus-cluster-view", daemon=True)
                # started under the lock: a concurrent read that finds it joins it, and
                # joining a thread not yet started raises (a /consumers 500 under the page)
                self._reading.start()
            running = self._reading
        if running is not None:
            running.join(VIEW_WAIT)
        with self._lock:
            out = dict(self._view)
            if self._view_at > float("-inf"):
                out["view_age_seconds"] = round(time.monotonic() - self._view_at, 3)
        down = self.down_for()
        out["zookeeper"] = {"connected": down == 0.0, "unreachable_seconds": round(down, 3)}
        return out

    def _read(self, nodes: MemberNodes) -> None:
        try:
            view = ClusterView(nodes.session, nodes.address, timeout=VIEW_READ_TIMEOUT)
            status = view.status()
            with self._lock:
                self._view = {"view": status}
                self._view_at = time.monotonic()
        except CoordinatorUnavailableError as exc:
            with self._lock:
                self._view = {**self._view, "view_error": str(exc)}
        finally:
            with self._lock:
                self._reading = None
