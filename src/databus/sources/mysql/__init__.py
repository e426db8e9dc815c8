"""MariaDB/MySQL binlog capture: the relay reads the server as a replica.

:mod:`.source` states the contract; the binlog protocol is :mod:`.connection`, events
:mod:`.events`, row decoding :mod:`.rows` (and :mod:`.fastpath`, the C codec), table
versions :mod:`.versions`, DDL :mod:`.ddl`, incremental snapshots' database side
:mod:`.snapshots` and :mod:`.chunks`. What it shares with the PostgreSQL source is in
:mod:`databus.sources.common`. Needs the ``mysql`` extra (pymysql); docs/mysql.md.
"""

from databus.sources.mysql.checks import ServerFacts, check_server, parse_mysql_url

__all__ = ["ServerFacts", "check_server", "parse_mysql_url"]
