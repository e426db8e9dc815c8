"""PostgreSQL source: logical decoding (pgoutput) through a replication slot.

Needs the ``postgresql`` extra (psycopg2); see docs/postgresql.md.
"""
