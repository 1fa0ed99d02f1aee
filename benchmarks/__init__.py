"""Benchmarks: `python -m benchmarks [--quick] [--only NAME]` (see `suites.py`)."""
