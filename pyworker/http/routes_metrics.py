"""GET /metrics: Prometheus exposition of this process's metrics and the database's gauges
(one query of runrow.queue_metrics per scrape, pyworker/worker/metrics.py).

Unauthenticated, as scrapers expect: it holds counts with bounded labels, never a run, a user
or any content. Put it behind the network policy that guards your other exporters.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pyworker.http.context import services
from pyworker.worker import metrics


async def get_metrics(request: Request) -> Response:
    return Response(await metrics.scrape(services(request).probe_pool), media_type=metrics.CONTENT_TYPE)


routes = [Route("/metrics", get_metrics, methods=["GET"])]
