"""databus.core: the words every other package speaks; it imports no other databus
package. Its modules are used one by one, so this file hands no names on (the
package :mod:`databus` hands on the common ones).

* :mod:`~databus.core.event`: the event codec (the V2 layout, docs/event-format.md);
  :mod:`~databus.core.window`: the window, a source transaction's events;
* :mod:`~databus.core.schema`: schemas, Avro and the schema registry;
  :mod:`~databus.core.avrobin`: hand-written Avro primitives;
* :mod:`~databus.core.checkpoint`: where a consumer is; :mod:`~databus.core.filters`:
  server-side filters;
* :mod:`~databus.core.envelope`: the JSON change envelope;
* :mod:`~databus.core.errors`: the one exception tree;
* :mod:`~databus.core.config`: reading config files; :mod:`~databus.core.access`: how a
  component reaches a relay (credentials, addresses);
* :mod:`~databus.core.atomic`, :mod:`~databus.core.lockfile`: atomic writes, lock files;
* :mod:`~databus.core.jsonsafe`, :mod:`~databus.core.redact`: JSON from outside with a
  nesting limit; secrets kept out of output;
* :mod:`~databus.core.lazy`: the lazy names of a package ``__init__``
  (docs/architecture.md).
"""
