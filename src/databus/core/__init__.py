"""databus.core."""
