"""The HTTP service behind `runrow serve` and the chat page (web/): a thin ASGI app over the
runrow.* SQL functions. All state lives in PostgreSQL, so any number of instances serve any run.

Imports pyworker.db only; the CLI imports it (`create_app(ServeConfig(...))` in pyworker.http.app).
"""
