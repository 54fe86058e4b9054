"""Long-poll HTTP server example (run server.py and load.py as scripts)."""
