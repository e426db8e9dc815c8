"""databus.sources.txlog."""
