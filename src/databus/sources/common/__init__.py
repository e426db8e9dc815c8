"""What the database sources (MySQL/MariaDB, PostgreSQL, SQLite) share, so each
source's own package keeps only what is its database's.

* :mod:`.names`: logical source ids and ``db.table`` names;
* :mod:`.tables`: which tables a source captures (include/exclude regexes);
* :mod:`.history`: the schema history file a source keeps in its state directory;
* :mod:`.signals`: the signal table's contract and sending a signal;
* :mod:`.incremental`: incremental snapshots (the DBLog watermark coordinator) and
  :class:`~.incremental.Snapshots`, what a source's commit does with them;
* :mod:`.progress`: snapshot progress records kept beside the relay's state;
* :mod:`.sqlfilter`: the ``additional-conditions`` of a snapshot signal, checked.

Column filters (:mod:`databus.sources.columns`) and column protection
(:mod:`databus.sources.protect`) stay beside :mod:`databus.sources.base`: the relay
and the bootstrap service use them too.
"""
