"""databus.bootstrap."""
