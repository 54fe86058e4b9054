"""Blocking-pop TCP server example (run server.py as a script)."""
