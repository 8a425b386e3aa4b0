"""Benchmarks of runrow: measured, not asserted. `python -m bench` runs them all (see __main__)."""
