"""runrow's Python reference worker: a thin client of the runrow.* SQL functions."""

__version__ = "0.1.0"
