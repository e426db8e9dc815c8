"""databus.buffer."""
