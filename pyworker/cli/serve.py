"""`runrow serve`: run the HTTP service with uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
import time
from pathlib import Path

from pyworker.cli.messages import first_line, read_text_option
from pyworker.cli.types import add_log_format, conninfo, env_default, host_name, number, port_number
from pyworker.cli.webhook_receivers import add_arguments as add_receiver_arguments
from pyworker.cli.webhook_receivers import allowed_networks
from pyworker.db import schema
from pyworker.db.config import database_url
from pyworker.http.auth import TokenConfigError, load_tokens_file, parse_tokens_env
from pyworker.http.config import MAX_BODY_BYTES, OPT_IN_FIELDS, ServeConfig

DEFAULT_MODEL = "claude-sonnet-4-5"
# How long serve waits at its start for a database still starting (as its pool would).
WAIT_FOR_DATABASE = 30
log = logging.getLogger("runrow.serve")

EPILOG = """\
endpoints (JSON; errors are {"error": {"type", "message"}}):
  POST /conversations/{id}/runs   enqueue a turn -> 202 {run_id, status, conversation_id}
  GET  /runs/{id}                 status, attempts, result or error
  GET  /runs/{id}/events          Server-Sent Events; resume with ?from=N or Last-Event-ID
  POST /conversations/{id}/stop   POST /runs/{id}/cancel
  GET  /approvals?limit=&after=   a page (limit 100, at most 1000) and its next cursor
  POST /approvals/{key}           {"approved": true|false, "note"?}
  GET  /metrics                   Prometheus metrics (no token: counts only, no run or user)
  GET  /                          the chat page

examples:
  runrow serve --insecure-dev                          # loopback demo, every caller is user "dev"
  RUNROW_TOKENS="$(openssl rand -hex 16)=alice" runrow serve --host 0.0.0.0
  runrow serve --insecure-dev --user-may-set webhook_url --allow-private-webhooks  # receivers on this machine
      # (the workers deliver to them only with their own: runrow worker --allow-private-webhooks)
  RUNROW_WEBHOOK_ALLOW_NETWORKS=10.96.0.0/12 runrow serve --user-may-set webhook_url ...  # and the
      # workers with the same variable: receivers on that network taken at enqueue and reached
  runrow serve --tokens-file tokens.json --replica-url postgresql://app@standby/app  # streams from a standby
  RUNROW_LOG_FORMAT=json runrow serve --tokens-file tokens.json --access-log  # one JSON object a line:
      # {"ts": "2026-01-05T10:00:00.123", "level": "INFO", "logger": "runrow.http.access",
      #  "msg": "10.0.0.7:50412 \\"GET /runs/RUN_ID\\" 200 3.1 ms", "http": {"method": "GET", ...}}
  runrow serve --tokens-file tokens.json --model claude-sonnet-4-5 --system-file prompt.txt \\
      --tools-module pyworker.demo.tools
"""


def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="serve the HTTP API and chat page (202 runs, resumable SSE, stop, approvals)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A thin ASGI service over the runrow.* functions. Every request is scoped to one "
        "user by a bearer token (--tokens-file or RUNROW_TOKENS); another user's conversation, run, "
        "stream or approval answers 404. All state is in PostgreSQL: run as many instances as you like. "
        "Runs are driven by `runrow worker` processes, not by this one.",
        epilog=EPILOG,
    )
    p.add_argument(
        "--host", type=host_name, default="127.0.0.1", help="address to bind (default %(default)s)"
    )
    p.add_argument("--port", type=port_number, default=8080, help="port (default %(default)s)")
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve GET /metrics on a listener of its own at this port (0: any free port, logged), "
        "and answer 404 for it on --port; default: /metrics on --port",
    )
    p.add_argument(
        "--metrics-host",
        type=host_name,
        default=None,
        help="address the metrics listener binds (default 127.0.0.1); needs --metrics-port",
    )
    p.add_argument(
        "--tokens-file",
        type=Path,
        help='JSON {"token": "user id", ...} (else env RUNROW_TOKENS=tok=user,...)',
    )
    p.add_argument(
        "--insecure-dev",
        action="store_true",
        help="no authentication: every request is user 'dev' (or its X-Runrow-User header); loopback only",
    )
    p.add_argument(
        "--model",
        default=env_default("RUNROW_MODEL", DEFAULT_MODEL),
        help="model pinned on runs that do not name one (default $RUNROW_MODEL or %(default)s)",
    )
    p.add_argument("--system-file", type=Path, help="system prompt pinned on runs that do not give one")
    p.add_argument(
        "--tools-module",
        default=env_default("RUNROW_TOOLS"),
        help="module whose registered tools are pinned on runs that give none (env RUNROW_TOOLS)",
    )
    p.add_argument(
        "--keepalive",
        type=number(float, 0.1, 3600),
        default=15.0,
        help="seconds between SSE keepalive comments, 0.1 to 3600",
    )
    p.add_argument(
        "--max-body",
        type=number(int, 1024, 1 << 30),
        default=MAX_BODY_BYTES,
        help="request body limit in bytes, 1024 to 2^30",
    )
    p.add_argument(
        "--pool-size", type=number(int, 1, 1000), default=10, help="database connections at most, 1 to 1000"
    )
    p.add_argument(
        "--replica-url",
        type=conninfo,
        default=env_default("RUNROW_REPLICA_URL", empty_is_unset=True),
        help="a hot standby of the database: event streams read journals there (lag delays a stream, "
        "never falsifies it); everything else, LISTEN included, stays on the primary "
        "(env RUNROW_REPLICA_URL)",
    )
    p.add_argument(
        "--listen-url",
        type=conninfo,
        default=env_default("RUNROW_LISTEN_URL", empty_is_unset=True),
        help="a direct (not pooled) PostgreSQL URL for the LISTEN connection that wakes event "
        "streams, when --database-url goes through a transaction pooler (env RUNROW_LISTEN_URL; "
        "default: the database URL)",
    )
    p.add_argument(
        "--no-session-limits",
        dest="session_limits",
        action="store_false",
        help="do not send TCP keepalives, tcp_user_timeout and the 60 s statement_timeout on the "
        "service's connections (then set them server-side: a network cut holds requests until the "
        "kernel's TCP timeout otherwise)",
    )
    p.add_argument(
        "--user-may-set",
        type=_user_fields,
        default=env_default("RUNROW_USER_MAY_SET", empty_is_unset=True),
        metavar="FIELD,...",
        help="enqueue fields users may set on their runs, beside content, if_active and start_in: "
        f"any of {', '.join(OPT_IN_FIELDS)} (default none: runs take the operator's --model, "
        "--system-file and --tools-module, and a request naming another field is a 403; "
        "env RUNROW_USER_MAY_SET)",
    )
    # The workers' own definition: the same variables, validation and messages, so a fleet
    # configured once accepts at enqueue what its workers deliver to (pyworker/cli/webhook_receivers.py).
    add_receiver_arguments(p, "serve")
    p.add_argument(
        "--max-attempts",
        type=number(int, 1, 100),
        default=1,
        help="attempts a run enqueued over HTTP gets, 1 to 100: with more, a run whose worker died "
        "is requeued (at-least-once model calls) instead of failed (default %(default)s, at-most-once, "
        "as enqueue_run's; a user's own max_attempts wins where --user-may-set max_attempts)",
    )
    p.add_argument(
        "--max-streams-per-user",
        type=number(int, 0, 1_000_000),
        default=100,
        help="event streams one user may hold open on this instance; more get a 429 with Retry-After "
        "(0: no limit; default %(default)s)",
    )
    p.add_argument(
        "--auth-failures-per-minute",
        type=number(int, 0, 1_000_000),
        default=10,
        help="requests without a valid token one client address may make a minute (a burst of that "
        "many, then one every 60/N s); past it the address gets a 429 too_many_auth_failures with "
        "Retry-After, a valid token included unless its user authenticated from that address "
        "before. The address is the TCP peer's, or behind a reverse proxy the one its "
        "X-Forwarded-For names (--forwarded-allow-ips); without that every client is the proxy, "
        "so set 0 there and limit at the proxy (0: no limit; default %(default)s)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        type=_proxy_addresses,
        metavar="IPS",
        default=None,
        help="comma-separated addresses or networks of the reverse proxies in front of this "
        "service (e.g. 10.0.0.5,10.1.0.0/16): a request from one of them is taken to come from "
        "the client its X-Forwarded-For header names (and X-Forwarded-Proto's scheme), for the "
        "failed-authentication limit and the access log. Default: none, the TCP peer is the "
        "client (a header a client sent itself would let it pose as any address)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=number(int, 0, 3600),
        default=5,
        help="seconds SIGTERM waits for open requests before ending them; event streams end at once "
        "(they never end on their own), and their clients resume on another instance with "
        "Last-Event-ID (default %(default)s)",
    )
    add_log_format(p, "one object per line, uvicorn's lines included")
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log one INFO line per request when it ends (logger runrow.http.access): client, "
        'method, path without the query string, status, duration, e.g. 10.0.0.7:50412 "GET '
        '/runs/RUN_ID" 200 3.1 ms; with --log-format json also an "http" object. Off by default: '
        "a Prometheus scrape is no log line",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from pyworker.http import server
    from pyworker.http.app import create_app
    from pyworker.worker import logs, tracing
    from pyworker.worker.collector import tune_collector

    logs.setup(args.log_format, args.log_level)
    tracing.configure_from_env()

    try:
        app = create_app(build_config(args))  # refuses a configuration with no way to authenticate
    except (TokenConfigError, ValueError, OSError) as exc:
        print(f"runrow serve: {exc}", file=sys.stderr)
        return 2
    problem = _unusable(args)
    if problem is not None:
        print(f"runrow serve: {problem}", file=sys.stderr)
        return 2
    tune_collector()
    server.run(  # uvicorn.run, and the event streams end as the shutdown starts
        app,
        host=args.host,
        port=args.port,
        # uvicorn configures no logging of its own: its lines go through the handler logs.setup
        # put on the root, in --log-format, at the root's --log-level.
        log_config=None,
        log_level=None,
        # Its access line has the query string (which can carry a token); --access-log is ours.
        access_log=False,
        # uvicorn's ProxyHeadersMiddleware: only a peer in --forwarded-allow-ips is believed.
        proxy_headers=args.forwarded_allow_ips is not None,
        forwarded_allow_ips=args.forwarded_allow_ips or "",
        timeout_graceful_shutdown=args.shutdown_grace,
    )
    return 0


def _proxy_addresses(text: str) -> str:
    """--forwarded-allow-ips: addresses or networks (or "*", every peer), each checked here:
    uvicorn took a typo for a host name to match and trusted no one, silently."""
    items = [item.strip() for item in text.split(",")]
    for position, item in enumerate(items, 1):
        if item == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"item {position} ({item!r}) is not an IP address or network (10.0.0.5, 10.1.0.0/16, or *)"
            ) from None
    return ",".join(items)


def _unusable(args: argparse.Namespace) -> str | None:
    """What would stop the service at its start, said before uvicorn starts: there, a database
    that cannot be reached was a PoolTimeout traceback 30 s later, and a --host that does not
    resolve an exit without naming it. Nothing is checked that could change once running."""
    import socket

    try:
        socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"--host {args.host}: {exc.strerror or exc}"
    from pyworker.cli.main import _metrics_address_problem  # the worker's flags, the same rules

    problem = _metrics_address_problem(args) or _metrics_port_problem(args)
    if problem is not None:
        return problem
    problem = _unreachable(
        database_url(args.database_url), "the database", "on it first", "DATABASE_URL or --database-url"
    )
    if problem is None and args.replica_url is not None:
        # The standby's pool is opened at start too, and failed the same way, 30 s later.
        problem = _unreachable(args.replica_url, "the hot standby", "on its primary", "--replica-url")
    return problem


ANY_HOST = ("0.0.0.0", "::", "")


def _metrics_port_problem(args: argparse.Namespace) -> str | None:
    """Why --metrics-port cannot be listened on, said before anything opens (the review of stop
    59): the API's own port was not refused and uvicorn then said "address already in use" of
    --port; a port in use was an OSError traceback from the app's start, its pools left open.
    A port taken between this check and the start still fails there."""
    import socket

    if args.metrics_port is None or args.metrics_port == 0:
        return None
    same_host = args.metrics_host == args.host or args.metrics_host in ANY_HOST or args.host in ANY_HOST
    if args.metrics_port == args.port and same_host:
        return f"--metrics-port {args.metrics_port} is --port's: give /metrics a port of its own"
    family = socket.AF_INET6 if ":" in args.metrics_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server binds
        try:
            probe.bind((args.metrics_host, args.metrics_port))
        except OSError as exc:
            return f"--metrics-port {args.metrics_port} on {args.metrics_host}: {exc.strerror or exc}"
    return None


def _unreachable(url: str, what: str, migrate_where: str, check: str) -> str | None:
    """Why the runrow database at url cannot serve, or None. A server still starting (a service
    and its database brought up together) is waited for, as the pool would wait. A URL that
    does not parse is refused at once (the argparse type, or here for DATABASE_URL)."""
    import psycopg

    deadline = time.monotonic() + WAIT_FOR_DATABASE
    said = False
    while True:
        try:
            with psycopg.connect(url, connect_timeout=10, autocommit=True) as conn:
                version = (conn.execute("SELECT runrow.schema_version()").fetchone() or (None,))[0]
            # On an older schema the service failed mid-request on a function it lacked.
            problem = schema.too_old(version, "this runrow serve")
            return None if problem is None else f"{what}: {problem}"
        except (psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedFunction):
            # Started anyway, it answered every request 500 "internal error".
            return f"{what} has no runrow schema: run `runrow migrate` {migrate_where}"
        except psycopg.errors.InsufficientPrivilege:
            return f"the login of {what} ({check}) may not call runrow's functions: GRANT runrow_client TO it"
        except psycopg.OperationalError as exc:
            if time.monotonic() < deadline:
                if not said:
                    # Else 30 s of silence before the one-line error.
                    reason = first_line(exc).rstrip(".")
                    log.warning(
                        "waiting for %s at %s (%s), up to %d s", what, _where(url), reason, WAIT_FOR_DATABASE
                    )
                    said = True
                time.sleep(1)
                continue
            error: psycopg.Error = exc
        except psycopg.Error as exc:
            error = exc
        return f"cannot connect to {what} ({first_line(error)}); check {check}"


def _where(url: str) -> str:
    """host:port/dbname of a database URL as libpq reads it, without its user or password."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    host = params.get("host") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    dbname = params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user") or ""
    return f"{host}:{port}/{dbname}"


def build_config(args: argparse.Namespace) -> ServeConfig:
    if args.insecure_dev and not _loopback(args.host):
        raise ValueError(
            f"--insecure-dev accepts every request unauthenticated: bind 127.0.0.1, not {args.host}"
        )
    tokens: dict[str, str] = {}
    if args.tokens_file is not None:
        tokens = load_tokens_file(args.tokens_file)
    elif os.environ.get("RUNROW_TOKENS"):
        tokens = parse_tokens_env(os.environ["RUNROW_TOKENS"])
    tools: list[dict] = []
    if args.tools_module:
        from pyworker.agent import tools as tool_registry

        # Exactly that module's tools (the process has imported others, e.g. the demo's).
        tools = tool_registry.load_module(args.tools_module).definitions()
    system = None if args.system_file is None else read_text_option(args.system_file, "--system-file")
    return ServeConfig(
        database_url=database_url(args.database_url),
        model=args.model,
        system_prompt=system,
        tools=tools,
        tokens=tokens,
        insecure_dev=args.insecure_dev,
        keepalive_seconds=args.keepalive,
        max_body_bytes=args.max_body,
        pool_max_size=args.pool_size,
        replica_url=args.replica_url,
        listen_url=args.listen_url,
        session_limits=args.session_limits,
        user_may_set=args.user_may_set or frozenset(),
        allow_private_webhooks=args.allow_private_webhooks,
        webhook_allow_networks=allowed_networks(args),
        max_streams_per_user=args.max_streams_per_user,
        auth_failures_per_minute=args.auth_failures_per_minute,
        max_attempts=args.max_attempts,
        access_log=args.access_log,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host or "127.0.0.1",
    )


def _user_fields(value: str) -> frozenset[str]:
    """--user-may-set's comma-separated names, each one of OPT_IN_FIELDS."""
    names = frozenset(name.strip() for name in value.split(",") if name.strip())
    unknown = sorted(names - set(OPT_IN_FIELDS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown)}: not a field users may be let set; choose from {', '.join(OPT_IN_FIELDS)}"
        )
    return names


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
