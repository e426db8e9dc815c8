"""databus.spark."""
