"""databus.coord: coordination through ZooKeeper, for relay clusters (members, roles,
epochs) and clients (failover to a cluster's members, dynamic groups). It depends on
core only, and it is the one package that imports kazoo.

* :mod:`~databus.coord.address`: the ``zk://HOST:PORT[,HOST:PORT...]/NAME`` address;
* :mod:`~databus.coord.session`: a ZooKeeper session (:func:`connect`), the one
  translator of kazoo's errors, its election and lease recipes;
* :mod:`~databus.coord.cluster`: a relay cluster's nodes: :class:`ClusterView` reads
  them, :class:`MemberNodes` is what one member writes.

This file only hands names on.
"""

from databus.coord.address import ZkAddress
from databus.coord.cluster import ClusterView, MemberNodes
from databus.coord.session import Election, Lease, Session, connect

__all__ = ["ClusterView", "Election", "Lease", "MemberNodes", "Session", "ZkAddress", "connect"]
