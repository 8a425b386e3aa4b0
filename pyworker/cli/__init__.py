"""The `runrow` command: one module per command group (worker and db in main, client commands,
approvals, serve, the tail renderer).

The top of the package: it may import everything; nothing imports it.
"""
