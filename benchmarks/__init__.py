"""Benchmarks: not part of the test suite's pass/fail ; they print side-by-side figures and ratios (docs/benchmarks.md)."""
