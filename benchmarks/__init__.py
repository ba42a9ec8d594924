"""Benchmarks that run outside the C build (torchtitan/)."""
