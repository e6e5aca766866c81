"""Benchmarks: figures printed from one run, never pass/fail on speed."""
