"""Benchmarks of aiopurgatory against the baselines Python users have.

Run ``python -m bench --help``; see ``bench/RESULTS.md`` for measured figures.
"""
