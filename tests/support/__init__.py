"""The tests' vocabulary: each module gives one kind of thing, read by every test.

* ``mariadb.MariaDB``, ``postgres.PostgreSQL``, ``zookeeper.ZooKeeper``: private servers
  (free port, temp dir, context managers); the session-wide ones are the ``mariadb``,
  ``postgres`` and ``zookeeper`` fixtures of ``tests/conftest.py``, and ``sql_url`` gives a
  fresh database of each SQL kind.
* ``sources``: sources built from a validated config and opened (``mysql_source``,
  ``sqlite_source``).
* ``relays``: in-process relays on a SQLite shop (``make_relay``) and reading ``/stream``
  like a client (``drain``); ``memrelay.MemoryRelay``: a relay served from memory.
* ``bootstrap``: an in-process bootstrap service, preloaded rows, replica checks.
* ``procs``: ``databus`` processes (``spawn``, ``wait_http``, ``kill9``, ``stop``);
  ``pipeline``: a test's named processes (``ProcessPipeline``, ``RelayPipeline``) and the
  one set of command-line builders (``relay_args``, ``replicate_args``,
  ``recorder_args``, ``write_config``).
* ``wait.wait_until``: the one deadline loop; ``relays.wait_persisted``: until a relay
  has flushed an SCN (instead of sleeping a flush interval).
* ``writers.Repeating``: a background writer thread (a workload step every N seconds).
* ``browser``: a headless chromium page for the page tests (``open_page``), or a skip.
* ``tls``: certificates (``make_certs``) and tokens (``add_token``) a test makes itself.
* ``shop``, ``bulk``, ``mysql_workload``, ``bootmysql``: writer workloads and checks.
* ``typematrix``: the MySQL type matrix; ``sparkrelay``: relays for the Spark tests.
* ``measures``: the suite's own measures (fixed sleeps, private servers, harnesses),
  printed by scripts/test.sh.
"""
