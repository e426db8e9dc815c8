"""databus.relay."""
