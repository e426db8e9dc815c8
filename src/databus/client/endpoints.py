"""Where a relay is: one URL, a list of member URLs, or a relay cluster's address.

``http://a:1``, ``http://a:1,http://b:2`` or ``zk://HOST:PORT/NAME`` name the
relays a client may read. Every member of a relay cluster holds the same windows
under the same SCNs, so a client moves to another member with the checkpoint it
has: it repeats at most the window it was reading (at-least-once) and loses
nothing. A list is tried in turn; a cluster address asks ZooKeeper for the live
members, the leader first, then the co-leaders, each time a member fails.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from databus.core.access import check_relay_spec
from databus.core.errors import RelayUnavailableError

if TYPE_CHECKING:
    from databus.coord import Session, ZkAddress

log = logging.getLogger("databus.client")


class Endpoints:
    """The relays behind a spec; :attr:`current` is the one in use."""

    def __init__(self, spec: str) -> None:
        self.spec = check_relay_spec(spec) if "://" in spec else spec
        self._session: Session | None = None
        self._address: ZkAddress | None = None
        if self.spec.startswith("zk://"):
            from databus.coord import ZkAddress

            self._address = ZkAddress.parse(self.spec)
            self.urls: list[str] = []
            self.current = ""
            self.current = self._resolve()[0]
        else:
            self.urls = self.spec.split(",")
            self.current = self.urls[0]

    @property
    def several(self) -> bool:
        return self._address is not None or len(self.urls) > 1

    def _resolve(self) -> list[str]:
        from databus.coord import ClusterView, connect
        from databus.core.errors import CoordinatorUnavailableError

        assert self._address is not None
        try:
            if self._session is None:
                self._session = connect(self._address, connect_timeout=10.0)
            urls = ClusterView(self._session, self._address).urls()
        except CoordinatorUnavailableError as exc:
            raise RelayUnavailableError(f"cluster {self._address}: {exc}") from exc
        if not urls:
            raise RelayUnavailableError(f"cluster {self._address} has no live member")
        self.urls = urls
        return urls

    def advance(self, avoid: frozenset[str] = frozenset()) -> str:
        """The member to try after :attr:`current` failed (the same one when it is the
        only one), one not in ``avoid`` when there is one."""
        failed = self.current
        if self._address is not None:
            urls = self._resolve()
            others = [u for u in urls if u != failed]
            fresh = [u for u in others if u not in avoid]
            self.current = fresh[0] if fresh else others[0] if others else urls[0]
        else:
            i = self.urls.index(failed) if failed in self.urls else -1
            order = self.urls[i + 1:] + self.urls[:i + 1]
            fresh = [u for u in order if u not in avoid]
            self.current = fresh[0] if fresh else order[0]
        if self.current != failed:
            log.info("relay %s failed: reading %s now", failed, self.current)
        return self.current

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
