"""Every error is `{"error": {"type": ..., "message": ...}}` with a 4xx/5xx that says what went wrong.

Database errors a caller can cause map by SQLSTATE; the runrow functions' messages already
name the argument at fault, so they pass through. A conversation of another user (42501)
answers 404 exactly like one that does not exist: the service never confirms it exists.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("runrow.http")

_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed"}


class ApiError(Exception):
    def __init__(self, status: int, type: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.headers = headers


def not_found(what: str, ident: object) -> ApiError:
    return ApiError(404, "not_found", f"{what} {ident} not found")


def error_response(
    status: int, type: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": {"type": type, "message": message}}, status_code=status, headers=headers)


# SQLSTATE -> (status, type) for the errors a caller can cause.
_SQLSTATES = {
    "22023": (400, "invalid_request"),  # invalid_parameter_value: the message names the argument
    "22004": (400, "invalid_request"),  # null_value_not_allowed
    "23514": (400, "invalid_request"),  # check_violation
    "22P02": (400, "invalid_request"),  # invalid_text_representation
    "54000": (400, "invalid_request"),  # program_limit_exceeded (e.g. a JSON value too deep)
    "55000": (409, "conflict"),  # object_not_in_prerequisite_state: wrong state for this action
    "40001": (503, "retry"),  # serialization_failure
    "40P01": (503, "retry"),  # deadlock_detected
    # lock_not_available: a stop or cancel hit its lock_timeout behind an unresponsive holder;
    # nothing changed, and the same call goes through once PostgreSQL has ended that session.
    "55P03": (503, "locked"),
}
# Seconds a client should wait before repeating the call; each retry waits up to the
# function's own lock_timeout (5 s) again, so retrying sooner only adds load.
_RETRY_AFTER = {"55P03": "5"}


# Classes a caller's value can cause even past the route's checks: data exceptions (22) and
# program limits (54, e.g. a JSON value too deep); with 23502/23514 the value broke a rule.
_BAD_INPUT_CLASSES = ("22", "54")
_BAD_INPUT_STATES = {"23502", "23514"}


def database_error(
    exc: psycopg.Error,
    pool: AsyncConnectionPool | None = None,
    what: str = "database connections (runrow serve --pool-size)",
) -> ApiError:
    """The answer to a database error; `pool`, the one a PoolTimeout waited on, tells a pool
    whose connections are all busy from a database that cannot be reached."""
    state = exc.sqlstate or ""
    if state in _SQLSTATES or state.startswith(_BAD_INPUT_CLASSES) or state in _BAD_INPUT_STATES:
        status, type_ = _SQLSTATES.get(state, (400, "invalid_request"))
        message = exc.diag.message_primary or str(exc)
        if exc.diag.message_hint:
            message = f"{message} ({exc.diag.message_hint})"
        retry = _RETRY_AFTER.get(state)
        return ApiError(status, type_, message, {"Retry-After": retry} if retry else None)
    if not state and isinstance(exc, psycopg.DataError):
        # psycopg refused to send the value at all (a NUL in a text parameter).
        return ApiError(400, "invalid_request", f"a value of the request cannot be stored: {exc}")
    if isinstance(exc, PoolTimeout) and pool is not None and _busy(pool):
        # Every connection is in use (say, waiting on a lock) and the pool could not get one
        # back in time: the database may be fine, this instance is saturated.
        return ApiError(
            503,
            "busy",
            f"all {pool.max_size} of this instance's {what} are busy; retry shortly",
            {"Retry-After": "1"},
        )
    if isinstance(exc, psycopg.OperationalError | psycopg.errors.AdminShutdown):
        # The pool tries to reconnect every 2 s or so (CancelSafePool): say when to come back.
        retry = {"Retry-After": "2"}
        return ApiError(503, "unavailable", "the database is unavailable; retry shortly", retry)
    log.error("unexpected database error %s: %s", state, exc)
    return ApiError(500, "internal", "internal error")


def _busy(pool: AsyncConnectionPool) -> bool:
    """Every connection the pool may have is open and lent out, and its last attempt to connect
    (CancelSafePool's last_error) did not fail: waiting was for a connection, not the server."""
    stats = pool.get_stats()
    full = stats.get("pool_size", 0) >= pool.max_size and stats.get("pool_available", 0) == 0
    return full and getattr(pool, "last_error", None) is None


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.type, exc.message, exc.headers)


async def handle_database_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, psycopg.Error)
    svc = getattr(request.app.state, "services", None)
    err = database_error(exc, None if svc is None else svc.pool)
    return error_response(err.status, err.type, err.message, err.headers)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    type_ = _HTTP_TYPES.get(exc.status_code, "http_error")
    message = exc.detail if exc.status_code != 404 else f"no endpoint {request.method} {request.url.path}"
    return error_response(exc.status_code, type_, str(message), dict(exc.headers or {}))


async def handle_unencodable(request: Request, exc: Exception) -> Response:
    # Text PostgreSQL cannot take (a lone surrogate, which JSON can spell as \ud800).
    return error_response(400, "invalid_request", "the request holds text that is not valid Unicode")


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal", "internal error")


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ApiError: handle_api_error,
    psycopg.Error: handle_database_error,
    HTTPException: handle_http_exception,
    UnicodeEncodeError: handle_unencodable,
    Exception: handle_unexpected,
}
