"""Benchmarks: not part of the test suite's pass/fail; each prints side-by-side figures and
ratios (docs/benchmarks.md)."""
