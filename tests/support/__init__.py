"""Shared helpers for the tests: a sample SQLite schema and a random writer."""
