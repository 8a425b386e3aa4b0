"""`runrow serve`: a thin ASGI service over the runrow.* SQL functions.

All state lives in PostgreSQL, so any number of instances can serve any run. Start with
`create_app(ServeConfig(...))` (pyworker.http.app) or the `runrow serve` command.
"""
