"""databus.kafka: publish a relay's change stream into Kafka (``databus publish``).

A relay client like any other (it reads relays through :mod:`databus.client`, never
their insides). Modules, one concept each:

* :mod:`~databus.kafka.config`: :class:`PublishConfig`, the validated options;
* :mod:`~databus.kafka.values`: column values and their Kafka Connect schemas (the
  ``databus`` and the Debezium-exact ``debezium`` modes);
* :mod:`~databus.kafka.envelope`: topic names, keys, the Debezium envelope, transaction
  metadata and heartbeat messages;
* :mod:`~databus.kafka.offsets`: the offsets topic (each publisher's checkpoint);
* :mod:`~databus.kafka.errors`: the one translator of confluent-kafka's errors;
* :mod:`~databus.kafka.publisher`: the publisher, one Kafka transaction per window.

Only ``publisher``, ``offsets`` and ``errors`` import confluent-kafka (the ``kafka``
extra); ``config``, ``values`` and ``envelope`` do not.
"""

from __future__ import annotations

from databus.kafka.config import PublishConfig

__all__ = ["PublishConfig"]
