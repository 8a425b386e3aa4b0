"""`runrow serve`'s connections carry the worker's protection against a dead peer.

Its pool and hub connected with autocommit and application_name only: a network black hole
between serve and the database held every request on a pooled connection until the kernel's
TCP timeout (minutes), and a dead serve's LISTEN session held back the notify queue as long.
Now the pool, the hub and the replica pool connect with libpq keepalives, tcp_user_timeout
and, in `options`, a statement_timeout and the server-side keepalives
(session_limits.serve_connection_kwargs); `--no-session-limits` leaves them out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from http_support import Server, private_database, serve

from pyworker.cli.main import build_parser
from pyworker.cli.serve import build_config
from pyworker.db.session_limits import serve_connection_kwargs


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_serve_limits")


def shown(server: Server, *names: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        async with server.services.pool.connection() as conn:
            values = {name: (await (await conn.execute(f"SHOW {name}")).fetchone())[0] for name in names}
            return {**values, "keepalives": conn.info.get_parameters().get("keepalives")}

    task = server.services.hub._task  # the pool is the server thread's loop's
    assert task is not None
    return asyncio.run_coroutine_threadsafe(read(), task.get_loop()).result(10)


def test_serve_connection_kwargs_protect_against_a_dead_peer(database_url: str) -> None:
    kwargs = serve_connection_kwargs(database_url)
    assert {
        k: kwargs[k] for k in ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count")
    } == {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 4,
    }
    assert kwargs["tcp_user_timeout"] == 30_000
    assert "-c statement_timeout=60000" in kwargs["options"]
    assert "-c tcp_keepalives_idle=10" in kwargs["options"]
    # The deployment's own settings win, as the worker's do.
    own = serve_connection_kwargs(database_url + ("&" if "?" in database_url else "?") + "keepalives_idle=99")
    assert "keepalives_idle" not in own


def test_serve_pool_and_hub_connect_with_the_limits(db: str) -> None:
    for server in serve(db):
        assert shown(server, "statement_timeout", "idle_in_transaction_session_timeout") == {
            "statement_timeout": "1min",
            "idle_in_transaction_session_timeout": "30s",
            "keepalives": "1",
        }
        hub_kwargs = server.services.hub._connect_kwargs
        assert hub_kwargs["keepalives"] == 1 and hub_kwargs["tcp_user_timeout"] == 30_000
        assert "statement_timeout=60000" in hub_kwargs["options"]


def test_no_session_limits_leaves_them_out(db: str) -> None:
    for server in serve(db, session_limits=False):
        assert shown(server, "statement_timeout")["statement_timeout"] == "0"
        assert server.services.hub._connect_kwargs == {}


def test_the_flag_reaches_the_config(db: str) -> None:
    base = ["--database-url", db, "serve", "--insecure-dev", "--host", "127.0.0.1"]
    assert build_config(build_parser().parse_args(base)).session_limits is True
    assert build_config(build_parser().parse_args([*base, "--no-session-limits"])).session_limits is False
