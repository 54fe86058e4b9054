"""Stands in for Cython's ``cython`` module when Cython is not installed (pure Python)."""

compiled = False
