"""A ZooKeeper address: ``zk://HOST:PORT[,HOST:PORT...]/NAME``.

``NAME`` names a relay cluster (its nodes under ``/databus/clusters/NAME``, see
:mod:`databus.coord.cluster`) or a client group (``/databus/groups/NAME``, see
:mod:`databus.client.membership`). Parsing is pure: nothing connects here.
"""

from __future__ import annotations

from dataclasses import dataclass

from databus.core.access import ZK_ADDRESS
from databus.core.errors import ConfigError

ROOT = "/databus/clusters"


@dataclass(frozen=True)
class ZkAddress:
    """``zk://HOST:PORT[,HOST:PORT]/NAME``."""

    hosts: str
    name: str

    @classmethod
    def parse(cls, text: str) -> ZkAddress:
        m = ZK_ADDRESS.match(text.strip())
        if m is None:
            raise ConfigError(f"not a cluster address: {text!r} (expected"
                              " zk://HOST:PORT[,HOST:PORT...]/NAME)")
        return cls(m["hosts"], m["name"])

    @property
    def path(self) -> str:
        """Where a relay cluster of this name keeps its nodes."""
        return f"{ROOT}/{self.name}"

    def __str__(self) -> str:
        return f"zk://{self.hosts}/{self.name}"
