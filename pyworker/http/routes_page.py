"""The chat page (static files in pyworker/http/web/, no build step), its bootstrap info, and health.

Served without authentication: the page holds no data; it asks for a token and sends it
with every API call.
"""

from __future__ import annotations

import os
from pathlib import Path

from psycopg_pool import PoolTimeout
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import PathLike, StaticFiles
from starlette.types import Scope

from pyworker.http.context import services
from pyworker.http.errors import database_error

WEB = Path(__file__).resolve().parent / "web"


HEALTH_TIMEOUT = 2.0  # seconds /healthz waits for a connection before it answers 503


class _PageFiles(StaticFiles):
    """The page's script and stylesheet, revalidated on every load as the page is (its ETag makes
    that a 304): an upgrade never pairs a new page with an old script. They hold no data, so
    they are not the API's `no-store` (pyworker/http/headers.py)."""

    def file_response(
        self, full_path: PathLike, stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.setdefault("Cache-Control", "no-cache")
        return response


async def index(request: Request) -> Response:
    return FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})


async def page_config(request: Request) -> Response:
    svc = services(request)
    return JSONResponse({"auth": "dev" if svc.config.insecure_dev else "bearer", "model": svc.config.model})


async def healthz(request: Request) -> Response:
    svc = services(request)
    # A probe gives up after a second or two: waiting out the pool's own timeout (30 s) for a
    # database that is down answered 503 long after the probe had stopped listening.
    try:
        async with svc.probe_pool.connection(timeout=HEALTH_TIMEOUT) as conn:
            cur = await conn.execute("SELECT runrow.schema_version()")
            row = await cur.fetchone()
    except PoolTimeout as exc:
        # Judged on the probe's pool, not the request pool the generic handler would look at.
        raise database_error(
            exc, svc.probe_pool, what="health probe connections (beside --pool-size)"
        ) from None
    return JSONResponse(
        {
            "ok": True,
            "schema_version": row[0] if row else None,
            "hub_connected": svc.hub.connected,
            "open_streams": svc.streams.open,
        }
    )


routes = [
    Route("/", index, methods=["GET"]),
    Route("/config", page_config, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Mount("/static", _PageFiles(directory=WEB), name="static"),
]
