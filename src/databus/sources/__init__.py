"""Change sources (fetchers) behind one contract: :class:`databus.sources.base.Source`;
:func:`open_source` builds the one a config describes (:mod:`.kinds`)."""

from databus.sources.kinds import open_source

__all__ = ["open_source"]
