"""Coordination through ZooKeeper (kazoo): cluster addresses, the members of a relay
cluster and their roles. Relays (cluster members) and clients (failover, groups)
use it; it depends on core only."""

from databus.coord.zk import ClusterView, ZkAddress, zk_client

__all__ = ["ClusterView", "ZkAddress", "zk_client"]
