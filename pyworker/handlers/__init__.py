"""Deprecated package: `pyworker.handlers.echo` is `pyworker.worker.echo`."""
