"""Benchmarks: ``python -m benchmarks {attention,offline} --help``. Results are JSON files."""

