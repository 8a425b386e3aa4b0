"""Connections that work through a transaction-mode pooler (pgbouncer), by construction.

In transaction pooling each transaction may run on another server connection, so nothing may
outlive a transaction on the server side:

- No server-side prepared statements. psycopg prepares a query after five executions
  (`_pg3_N`); through pgbouncer the next transaction lands elsewhere and fails with
  `prepared statement "_pg3_10" does not exist`, or — two clients' statements of the same name
  — binds one client's parameters to another's statement. The pooler cannot be seen from the
  client, so every connection runrow opens (except the hub's, which must be direct anyway) is
  made with `prepare_threshold=None`. Measured on the 2-core test box, direct over a Unix
  socket: 0.1–0.4 ms more per call (heartbeat 0.31 → 0.57 ms, an empty claim_runs 1.08 →
  1.47 ms); the functions' own plans are cached inside PL/pgSQL either way. A worker makes a
  few such calls per run and second, so this is well under a percent of one core.
- No session settings. The worker's per-session limits (session_limits.py) travel in the
  `options` startup parameter, which pgbouncer refuses ("unsupported startup parameter:
  options") unless `ignore_startup_parameters` lists it — and then drops. `accepted_kwargs`
  connects once and, on that refusal, goes on without `options` and says what to set
  server-side instead.
- Advisory locks only transaction-scoped (the SQL functions' `pg_advisory_xact_lock`, migrate's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

log = logging.getLogger("runrow.db")

POOLER_SAFE: dict[str, Any] = {"prepare_threshold": None}

REFUSED_OPTIONS = "unsupported startup parameter: options"
# A wait for the database is logged when it starts, when the error changes, and this often:
# once every 0.5 s was 60 identical INFO lines before the error that ended it.
WAIT_LOG_EVERY = 10.0
# How the server refuses a connection for want of a slot (SQLSTATE 53300): max_connections
# with the reserved slots, a role's or a database's CONNECTION LIMIT. At connect psycopg gives
# no SQLSTATE, so the text says it.
NO_SLOTS = ("too many clients", "too many connections", "connection slots are reserved")


def out_of_slots(exc: BaseException) -> bool:
    """Whether `exc` is the server refusing a connection for want of a slot."""
    return getattr(exc, "sqlstate", None) == "53300" or any(text in str(exc) for text in NO_SLOTS)


async def accepted_kwargs(
    conninfo: str,
    kwargs: dict[str, Any],
    *,
    what: str,
    patience: float = 30.0,
    failed: Callable[[BaseException], None] | None = None,
) -> dict[str, Any]:
    """`kwargs`, less `options` when the server on `conninfo` (a pooler) refuses that startup
    parameter. Until the server answers, for up to `patience` seconds, it asks again: a worker
    started while its pgbouncer was still down (services started in the wrong order) kept
    `options`, and every connection the pooler then refused (the pooler audit). After that, the
    error is left for the caller's pool to retry and report; `failed` is told each one, so
    that a caller giving up can say what the server answered."""
    if "options" not in kwargs:
        return kwargs
    deadline = time.monotonic() + patience
    said, said_at = "", 0.0
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, connect_timeout=10, **kwargs
            )
        except psycopg.OperationalError as exc:
            if REFUSED_OPTIONS in str(exc):
                break
            if failed is not None:
                failed(exc)
            # Only while nothing answers (no SQLSTATE: refused, unreachable) or the server is
            # starting: a wrong password or database is left at once to the pool to report.
            if time.monotonic() >= deadline or exc.sqlstate not in (None, "57P03"):
                return kwargs
            lines = str(exc).strip().splitlines()
            line = lines[0] if lines else type(exc).__name__
            if line != said or time.monotonic() - said_at >= WAIT_LOG_EVERY:
                log.info("%s: waiting for the database: %s", what, line)
                said, said_at = line, time.monotonic()
            await asyncio.sleep(0.5)
            continue
        await conn.close()
        return kwargs
    log.warning(
        "%s: the server refuses the options startup parameter (a pooler such as pgbouncer): "
        "connecting without the per-session limits, so set idle_in_transaction_session_timeout, "
        "tcp_keepalives_* and tcp_user_timeout server-side (ALTER ROLE ... SET, or the pooler's "
        "idle_transaction_timeout and tcp_* settings; README, Deployment), or a cut-off worker "
        "keeps its locks until TCP notices",
        what,
    )
    return {key: value for key, value in kwargs.items() if key != "options"}


async def accepted_kwargs_within(
    targets: Sequence[tuple[str, dict[str, Any], str]],
    *,
    deadline: float,
    failed: Callable[[BaseException], None] | None = None,
) -> list[dict[str, Any]]:
    """accepted_kwargs for each (conninfo, kwargs, what) in turn, all within one wait that ends
    at `deadline` (time.monotonic()): a database that is not up yet is waited for once, not once
    per kind of connection a process opens (a pool, a LISTEN, a standby's pool)."""
    return [
        await accepted_kwargs(
            conninfo, kwargs, what=what, patience=max(0.0, deadline - time.monotonic()), failed=failed
        )
        for conninfo, kwargs, what in targets
    ]
