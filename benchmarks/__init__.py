"""Benchmarks: access cost against the bounds, wall clock on real stores (python -m benchmarks)."""
