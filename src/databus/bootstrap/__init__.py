"""The bootstrap service (docs/bootstrap.md).

* :mod:`.store` - log and snapshot tables behind one contract (SQLite,
  PostgreSQL, MariaDB);
* :mod:`.producer` - relay client appending windows to the log;
* :mod:`.applier` - folds the log into the snapshot;
* :mod:`.server` - :class:`~.server.BootstrapServer`, the HTTP API (``/startSCN``,
  ``/targetSCN``, ``/bootstrap``);
* :mod:`.service` - :class:`~.service.BootstrapService`, all of them in one process,
  with the initial load;
* :mod:`.config` - the configuration file.

The client side is :mod:`databus.client.bootstrap`.
"""
