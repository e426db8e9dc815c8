"""The binlog service: any relay served as MySQL binlog files and a MySQL replication
server (issue 19).

Modules: :mod:`~databus.binlog.events` (binlog v4 event encoders),
:mod:`~databus.binlog.types` (relay schema -> MySQL column types, value encoding),
:mod:`~databus.binlog.store` (files, index, position map, purge, waiting),
:mod:`~databus.binlog.convert` (the converter: relay windows -> binlog transactions),
:mod:`~databus.binlog.config` (the service's configuration).
"""
