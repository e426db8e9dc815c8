"""databus.sources."""
