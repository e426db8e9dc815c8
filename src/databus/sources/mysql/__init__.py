"""MariaDB/MySQL binlog capture (first cut; see docs/mysql.md for what is missing)."""

from databus.sources.mysql.checks import ServerFacts, check_server, parse_mysql_url

__all__ = ["ServerFacts", "check_server", "parse_mysql_url"]
