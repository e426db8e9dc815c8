"""MariaDB/MySQL binlog capture (in progress: start-up checks so far)."""

from databus.sources.mysql.checks import ServerFacts, check_server, parse_mysql_url

__all__ = ["ServerFacts", "check_server", "parse_mysql_url"]
