"""Benchmarks: reproducible measurements of the core against public traces (adapters + CLI glue)."""
