"""Benchmarks: ``python -m minisgl.bench {attention,offline} --help``. Results are JSON files."""

__lesson__ = 'tooling'
