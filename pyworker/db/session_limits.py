"""Server-side limits on every worker connection, derived from the lease.

A worker that freezes inside a transaction (SIGSTOP, a long GC pause, a host cut off from the
network) keeps its runs' row locks until its session ends, and without limits PostgreSQL only
ends it when TCP keepalive notices: two hours by default. So each worker connection asks, in
its startup packet, for PostgreSQL itself to end a dead holder within about one lease:

- `idle_in_transaction_session_timeout` = the lease: a session idle inside a transaction that
  long is terminated and rolled back, its locks released, by the time its lease has lapsed
  and the reaper wants the row. Healthy worker transactions go idle for milliseconds.
- server-side `tcp_keepalives_*` and `tcp_user_timeout`: a vanished client is noticed within
  about a lease, including a backend blocked sending to it (which no timeout interrupts) and
  the hub's idle LISTEN session (a dead listener holds back the notify queue).
- the same keepalives and `tcp_user_timeout` as libpq parameters, so the worker notices a dead
  server or network as fast and reconnects instead of waiting on a silent socket.
- `statement_timeout` = 10 leases, at least a minute: a backstop for a worker statement stuck
  behind someone else's lock. Generous, because trimming a long backlog is legitimately slow.

A setting already in the connection string (or PGOPTIONS) wins over the derived one, so a DBA
can override any of them per deployment. Over a Unix socket the TCP settings do nothing.

`runrow serve` holds no leases, but a network black hole between it and the database left its
requests hanging on pooled connections until the kernel's TCP timeout (minutes), and a dead
serve's LISTEN session holding back the notify queue as long. `serve_connection_kwargs` gives
its pool and hub the same protection at fixed values: a dead peer noticed within
SERVE_DEAD_PEER_SECONDS, and a statement_timeout of SERVE_STATEMENT_TIMEOUT_MS, far past any
HTTP client's patience. An event stream is unaffected: it reads a page per wake on a pooled
connection, and the hub's LISTEN runs no statement while it waits.
"""

from __future__ import annotations

import os
from typing import Any

from psycopg.conninfo import conninfo_to_dict

KEEPALIVE_PROBES = 4
SERVE_DEAD_PEER_SECONDS = 30
SERVE_STATEMENT_TIMEOUT_MS = 60_000


def worker_connection_kwargs(conninfo: str, lease_seconds: int) -> dict[str, Any]:
    """psycopg connection kwargs for a worker's pool and hub on `conninfo` with this lease."""
    if lease_seconds < 1:
        raise ValueError("lease_seconds must be at least 1")
    return _connection_kwargs(conninfo, lease_seconds, max(60_000, 10 * lease_seconds * 1000))


def serve_connection_kwargs(conninfo: str) -> dict[str, Any]:
    """psycopg connection kwargs for `runrow serve`'s pools and hub on `conninfo`."""
    return _connection_kwargs(conninfo, SERVE_DEAD_PEER_SECONDS, SERVE_STATEMENT_TIMEOUT_MS)


def _connection_kwargs(conninfo: str, lease_seconds: int, statement_timeout_ms: int) -> dict[str, Any]:
    given = conninfo_to_dict(conninfo)
    idle = max(1, lease_seconds // 3)
    interval = max(1, (lease_seconds - idle) // KEEPALIVE_PROBES)
    lease_ms = lease_seconds * 1000
    client: dict[str, Any] = {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": KEEPALIVE_PROBES,
        "tcp_user_timeout": lease_ms,
    }
    server = {
        "idle_in_transaction_session_timeout": lease_ms,
        "statement_timeout": statement_timeout_ms,
        "tcp_keepalives_idle": idle,
        "tcp_keepalives_interval": interval,
        "tcp_keepalives_count": KEEPALIVE_PROBES,
        "tcp_user_timeout": lease_ms,
    }
    kwargs = {key: value for key, value in client.items() if key not in given}
    # libpq reads PGOPTIONS only when no options are given, so it is carried over by hand.
    theirs = given.get("options") or os.environ.get("PGOPTIONS", "")
    # Later -c switches win: the deployment's own options go last.
    ours = " ".join(f"-c {name}={value}" for name, value in server.items())
    kwargs["options"] = f"{ours} {theirs}".strip()
    return kwargs
