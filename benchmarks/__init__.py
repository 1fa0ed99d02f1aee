"""Benchmarks: `python -m benchmarks` (see issue 5; not yet written)."""
