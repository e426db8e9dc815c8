"""databus.client."""
