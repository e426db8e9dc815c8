"""The binlog service: any relay served as MySQL binlog files and a MySQL replication
server (issue 19). One module per concept; each docstring states its contract.

Writing the binlog: :mod:`~databus.binlog.convert` (the converter: relay windows ->
binlog transactions), :mod:`~databus.binlog.types` (relay fields -> MySQL columns),
:mod:`~databus.binlog.values` (MySQL's binary value formats),
:mod:`~databus.binlog.rowevents` (Table_map and rows events), :mod:`~databus.binlog.ddl`
(CREATE/ALTER TABLE), :mod:`~databus.binlog.events` (binlog v4 event encoders),
:mod:`~databus.binlog.binfile` (what one file holds).

The data directory: :mod:`~databus.binlog.store` (files, index, purge, recovery,
waiting), :mod:`~databus.binlog.posmap` (the position map),
:mod:`~databus.binlog.gtids` (GTID sets).

Serving it: :mod:`~databus.binlog.server` (the MySQL-protocol server and the service's
wiring), :mod:`~databus.binlog.transport` (a connection's bytes),
:mod:`~databus.binlog.sql` (the SQL clients send), :mod:`~databus.binlog.catalog`
(information_schema), :mod:`~databus.binlog.dump` (a dump), with
:mod:`~databus.binlog.request` (its request), :mod:`~databus.binlog.framing` (its
packets), :mod:`~databus.binlog.chunks` (packets shared between dumps) and
:mod:`~databus.binlog.notifier` (waking waiting dumps).

:mod:`~databus.binlog.config` is the service's configuration. MySQL's wire constants
(event types, header layout, commands, column types) are shared with the MySQL source in
:mod:`databus.core.mysqlwire`.
"""
