"""Sluice benchmarks. Never part of the test run: `tests/benchmarks` tests only their pure parts."""
