"""databus.relay: the relay process: capture a source into the event buffer and serve
it over HTTP. Its modules are used one by one (the CLI builds a
:class:`~databus.relay.relay.Relay` from a :class:`~databus.relay.config.RelayConfig`),
so this file hands no names on.

* :mod:`~databus.relay.config`: the relay's configuration (``RelayConfig``, ``cluster:``);
* :mod:`~databus.relay.identity`: its name, state files and locks;
* :mod:`~databus.relay.relay`: :class:`~databus.relay.relay.Relay`, start-up and
  where capture resumes;
* :mod:`~databus.relay.fetcher`: the capture thread (source -> buffer) and the relay state;
* :mod:`~databus.relay.app`, :mod:`~databus.relay.stream`, :mod:`~databus.relay.openapi`,
  :mod:`~databus.relay.metrics`: the HTTP API, ``/stream`` and its long polls, the
  OpenAPI document, the Prometheus metrics;
* :mod:`~databus.relay.cluster`: a relay as a member of a relay cluster (roles, fencing),
  with :mod:`~databus.relay.highwater` (what its consumers may read) and
  :mod:`~databus.relay.member` (what it needs of its relay; the idle source).
"""
