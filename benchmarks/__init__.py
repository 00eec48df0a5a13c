"""Benchmarks: not part of the test suite's pass/fail (see DESIGN.md)."""
