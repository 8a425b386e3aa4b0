"""`runrow` command line. Each subcommand is a small function; argparse does the rest."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg

from pyworker.cli.messages import first_line, unparsable_url_reason
from pyworker.cli.output import WRITE_ERRORS, stdout_lost
from pyworker.cli.parser import RunrowParser
from pyworker.cli.types import (
    add_log_format,
    conninfo,
    env_default,
    host_name,
    name_env_defaults,
    not_utf8,
    number,
    one_of,
    port_number,
    sdk_retries_problem,
    secret,
    worker_id,
)
from pyworker.cli.worker_env import ENVIRONMENT, model_key_problem
from pyworker.db import devdb
from pyworker.db.config import ConfigError, database_url, env_database_url
from pyworker.db.migrate import MigrateError

if TYPE_CHECKING:
    from pyworker.worker.webhooks import WebhookSettings

DESCRIPTION = """\
runrow: durable AI-agent runs on plain PostgreSQL. A run is a row: enqueued, claimed,
leased, fenced, journaled, resumed and stopped by the runrow.* SQL functions.

Every command that talks to the database takes --database-url (before or after the
command), else DATABASE_URL, else the cluster started by `runrow db start`.
"""


def cmd_migrate(args: argparse.Namespace) -> int:
    from pyworker.db.migrate import migrate

    result = migrate(database_url(args.database_url))
    print(migrate_summary(result.applied, len(result.functions), result.version))
    return 0


def migrate_summary(applied: list[str], functions: int, version: str) -> str:
    """What `runrow migrate` did, in one line. It printed every migration applied on one line and
    logged one INFO line for each: 86 of them for a new database (each is a DEBUG line now)."""
    if not applied:
        return (
            f"schema at {version}: up to date, no migration to apply ({functions} function files re-applied)"
        )
    # By number, not in the order applied: yoyo orders by dependency, which need not be the same.
    first, last = (min(applied).split("_", 1)[0], max(applied).split("_", 1)[0])
    span = first if len(applied) == 1 else f"{first}…{last}"
    many = "migration" if len(applied) == 1 else "migrations"
    return f"applied {len(applied)} {many} ({span}) and {functions} function files; schema at {version}"


def cmd_db(args: argparse.Namespace) -> int:
    if args.database_url is not None and args.action != "run":
        # Taken by every command's parser now, it would be ignored here without a word.
        print(
            f"runrow db {args.action}: --database-url does not apply: `runrow db` starts and stops "
            "this folder's throwaway cluster",
            file=sys.stderr,
        )
        return 2
    if args.action == "start":
        existing = devdb.load_state()
        if existing is not None and os.path.exists(existing.root):
            print(f"already running: {existing.url}")
            return 0
        cluster = devdb.start()
        devdb.save_state(cluster)
        print(cluster.url)
        print(f"export DATABASE_URL='{cluster.url}'", file=sys.stderr)
        return 0
    if args.action == "stop":
        cluster = devdb.load_state()
        if cluster is None:
            print("no throwaway cluster is running (nothing in .runrow/db.json)")
            return 0
        devdb.stop(cluster)
        devdb.STATE_FILE.unlink(missing_ok=True)
        print("stopped and removed")
        return 0
    if args.action == "url":
        cluster = devdb.load_state()
        if cluster is None:
            print("no throwaway cluster is running: `runrow db start`", file=sys.stderr)
            return 1
        print(cluster.url)
        return 0
    # run: a throwaway cluster for the life of one command (tests, demo, benchmarks).
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("runrow db run: give a command, for example `runrow db run -- pytest`", file=sys.stderr)
        return 2
    if shutil.which(command[0]) is None:
        print(f"runrow db run: {command[0]}: command not found (or not executable)", file=sys.stderr)
        return 127
    from pyworker.cli import db_run

    if args.database_url is not None:
        return db_run.run(command, dict(os.environ, DATABASE_URL=args.database_url))
    if env_database_url() is not None:
        return db_run.run(command)
    with devdb.throwaway() as cluster:
        env = dict(os.environ, DATABASE_URL=cluster.url, RUNROW_SUPERUSER_URL=cluster.superuser_url)
        return db_run.run(command, env)  # the cluster is stopped when CMD has ended, signal or not


def cmd_worker(args: argparse.Namespace) -> int:
    from pyworker.worker import early_signals

    early_signals.install()  # first: a SIGTERM while the handler loads must still drain, exit 0
    import asyncio

    from pyworker.cli.worker_exit import run_to_exit
    from pyworker.worker import logs, tracing
    from pyworker.worker.handler import load_handler
    from pyworker.worker.process import SchemaMissing, Worker

    logs.setup(args.log_format, args.log_level)
    tracing.configure_from_env()
    problem = sdk_retries_problem() or _metrics_address_problem(args) or _webhook_rotation_problem(args)
    if problem is not None:
        print(f"runrow worker: {problem}", file=sys.stderr)
        return 2
    try:
        handler = load_handler(args.handler)
    except (ImportError, ValueError) as exc:
        print(f"runrow worker: cannot load --handler {args.handler!r}: {exc}", file=sys.stderr)
        return 2
    config: dict[str, object] = {"max_model_calls": args.max_model_calls}
    if args.tools:
        config["tools_module"] = args.tools
    if args.tools:
        os.environ["RUNROW_TOOLS"] = args.tools
        from pyworker.agent.tools import load_module

        # Imported now, as the agent loop will (load_module keeps it): a module that cannot be
        # imported would otherwise fail every run this worker claims, one by one.
        try:
            load_module(args.tools)
        except (ImportError, ValueError) as exc:
            print(f"runrow worker: --tools {args.tools!r}: {exc}", file=sys.stderr)
            return 2
    problem = model_key_problem(handler)
    if problem is not None:
        print(f"runrow worker: {problem}", file=sys.stderr)
        return 2
    worker = Worker(
        database_url(args.database_url),
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        drain_seconds=args.drain,
        poll_seconds=args.poll,
        reap_interval=args.reap_interval,
        grace_seconds=args.grace,
        trim_after=args.trim_after * 3600 if args.trim_after > 0 else None,
        handler=handler,
        worker_id=args.worker_id,
        config=config,
        pool_size=args.pool_size,
        session_limits=args.session_limits,
        listen_conninfo=args.listen_url,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host or "127.0.0.1",
        webhooks=webhook_settings(args),
    )
    from psycopg_pool import PoolTimeout

    from pyworker.worker.collector import tune_collector

    tune_collector()
    try:
        return asyncio.run(run_to_exit(worker))
    except OSError as exc:  # e.g. --metrics-port already taken
        print(f"runrow worker: {exc}", file=sys.stderr)
        return 2
    except SchemaMissing as exc:
        print(f"runrow worker: {exc}", file=sys.stderr)
        return 2
    except PoolTimeout as exc:
        print(f"runrow worker: {_cannot_connect(exc)}", file=sys.stderr)
        return 2


def _cannot_connect(exc: BaseException) -> str:
    """Why a starting worker gave up on its database, with what the server last answered: a
    server out of connection slots was reported as one that might be down."""
    from pyworker.db.pooling import out_of_slots

    seconds = getattr(exc, "seconds", 30)
    error = getattr(exc, "error", None)
    if error is not None and out_of_slots(error):
        return (
            f"cannot connect to the database within {seconds:g} s: {first_line(error)}; the server "
            "has no connection slots left: raise max_connections (or the role's or database's "
            "CONNECTION LIMIT), or take connections from other clients (README, For DBAs: "
            "max_connections)"
        )
    said = f" ({first_line(error)})" if error is not None else ""
    return (
        f"cannot connect to the database within {seconds:g} s{said}; check DATABASE_URL / "
        "--database-url and that the server is up (`runrow migrate` must have run); through a "
        "pooler that refuses the options startup parameter, --no-session-limits"
    )


def _metrics_address_problem(args: argparse.Namespace) -> str | None:
    """Why --metrics-host/--metrics-port cannot be served, said before the database is asked:
    a host that does not resolve failed only after connecting, without naming the option, and
    --metrics-host alone was ignored without a word."""
    import socket

    if args.metrics_port is None:
        return "--metrics-host needs --metrics-port" if args.metrics_host is not None else None
    args.metrics_host = args.metrics_host or "127.0.0.1"
    try:
        socket.getaddrinfo(args.metrics_host, args.metrics_port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"--metrics-host {args.metrics_host}: {exc.strerror or exc}"
    return None


def _proxy_url(text: str) -> str:
    """--webhook-proxy: an http:// or https:// URL with a host (httpx's proxy). Never echoed: it
    may hold a password."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port that is not 0-65535)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a URL, http://host:port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError("must be an http:// or https:// URL with a host (http://proxy:3128)")
    return text


_proxy_url.never_shown = True  # type: ignore[attr-defined]  # it may hold a password


def webhook_settings(args: argparse.Namespace) -> WebhookSettings | None:
    """The worker's webhook delivery settings, or None (no secret: this worker delivers none)."""
    from pyworker.cli.webhook_receivers import allowed_networks
    from pyworker.worker.webhooks import WebhookSettings

    if not args.webhook_secret:
        return None
    return WebhookSettings(
        secret=args.webhook_secret,
        timeout=args.webhook_timeout,
        max_attempts=args.webhook_attempts,
        backoff_seconds=args.webhook_backoff,
        poll_seconds=args.webhook_poll,
        proxy=args.webhook_proxy,
        per_receiver=args.webhook_per_receiver,
        signing=args.webhook_signing,
        previous_secret=args.webhook_previous_secret,
        allow_private=args.allow_private_webhooks,
        allow_networks=allowed_networks(args),
    )


def _webhook_rotation_problem(args: argparse.Namespace) -> str | None:
    """Why --webhook-previous-secret cannot be what was meant (never quoting either secret).
    Without a current secret the worker would deliver nothing, and with the current one again
    nothing would be rotated: both are a rotation's step done half."""
    if args.webhook_previous_secret is None:
        return None
    if not args.webhook_secret:
        return (
            "--webhook-previous-secret (RUNROW_WEBHOOK_PREVIOUS_SECRET) needs --webhook-secret "
            "(RUNROW_WEBHOOK_SECRET), the new secret: without one this worker would deliver nothing"
        )
    if args.webhook_previous_secret == args.webhook_secret:
        return (
            "--webhook-previous-secret (RUNROW_WEBHOOK_PREVIOUS_SECRET) is the same as "
            "--webhook-secret (RUNROW_WEBHOOK_SECRET): in a rotation the current secret is the new one"
        )
    return None


def in_range(setting: str, unit: float = 1) -> Callable[[str], float]:
    """An argparse type for a worker setting: its range is Worker's (pyworker.worker.settings, in
    units of `unit` seconds), so a value that cannot work is a usage error naming the flag and
    the range, not a traceback or a worker whose every reaper pass fails."""
    from pyworker.worker.settings import LIMITS, WEBHOOK_LIMITS

    kind, lo, hi = {**LIMITS, **WEBHOOK_LIMITS}[setting]
    return number(kind, lo / unit, hi / unit)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, except for on/off switches: "--no-session-limits ...
    (default: True)" reads as if the limits were off by default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # Nor where there is no default to show, or the help already says what it is, or the
        # default is a secret taken from the environment (a webhook secret, a proxy URL with a
        # password: `--help` printed them).
        if (
            action.nargs == 0
            or action.default is None
            or "default" in (action.help or "")
            or getattr(action.type, "never_shown", False)
        ):
            return action.help
        return super()._get_help_string(action)


def _version() -> str:
    """The package's version and the newest migration it ships: what an operator compares with a
    database's runrow.schema_version() (a worker refuses a database older than that)."""
    from importlib.metadata import PackageNotFoundError, version

    from pyworker.db.schema import required_version

    try:
        package = version("runrow")
    except PackageNotFoundError:  # run from a source tree that was never installed
        package = "(not installed)"
    return f"runrow {package} (schema {required_version()})"


def build_parser() -> argparse.ArgumentParser:
    from pyworker.cli.client import _action, _wrap
    from pyworker.worker.settings import (
        DEFAULT_MAX_MODEL_CALLS,
        DEFAULT_WEBHOOK_PER_RECEIVER,
        DEFAULT_WEBHOOK_SIGNING,
        WEBHOOK_SIGNING_MODES,
    )

    parser = RunrowParser(
        prog="runrow", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter, top=True
    )
    parser.add_argument(
        "--version",
        action="version",
        version=_version(),
        help="print runrow's version and the schema it needs (`runrow migrate` installs it), then exit",
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "migrate",
        help="install or upgrade the runrow schema and functions",
        description="Apply pending migrations (yoyo) and re-apply every file in "
        "functions/. Safe to run from several processes at once.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Prints one line: how many migrations it applied (or that the schema is up to date) "
        "and the schema version; --log-level DEBUG logs each migration as it is applied.\n\n"
        "examples:\n  runrow migrate\n  runrow --database-url postgresql://admin@db/app migrate"
        "   # a direct URL, not a pooler's\n"
        "  runrow --log-level DEBUG migrate   # and each migration applied",
    )
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "db",
        help="a throwaway PostgreSQL cluster for development",
        description=_wrap(
            "start: create a private cluster from the PostgreSQL 15 binaries "
            "and print its URL (kept in .runrow/db.json). stop: remove it. url: print it. "
            "run -- CMD: run CMD with DATABASE_URL set to a cluster that lives only as "
            "long as CMD (unless DATABASE_URL is already set)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  runrow db start          # then every runrow command in this folder uses it\n"
        "  runrow db run -- pytest -q\n  runrow db stop",
    )
    p.set_defaults(func=cmd_db)
    # Actions of their own, not a positional with choices: `db stop --help` prints help instead
    # of removing the cluster, and `db start extra` is a usage error.
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    _action(
        actions,
        "start",
        help="create the cluster (once) and print its URL (kept in .runrow/db.json of this folder)",
        example="runrow db start && runrow migrate && runrow worker",
    )
    _action(actions, "stop", help="stop the cluster and remove its folder", example="runrow db stop")
    _action(actions, "url", help="print the running cluster's URL", example='psql "$(runrow db url)"')
    r = actions.add_parser(
        "run",
        help="run a command on a cluster that lives as long as it",
        description="Run CMD with DATABASE_URL set to a throwaway cluster that is removed when CMD "
        "exits (unless --database-url is given or DATABASE_URL is set: then on that server). Exits "
        "with CMD's code. "
        "SIGTERM, SIGINT and SIGHUP are passed on to CMD; then, once CMD has ended and the "
        "cluster is removed, the exit code is 128 + the signal.",
        epilog="example: runrow db run -- pytest -q tests/test_races.py",
    )
    r.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")

    p = sub.add_parser(
        "worker",
        help="run a worker: claim queued runs and drive them to an ending",
        formatter_class=DefaultsHelpFormatter,
        description=_wrap(
            "Claim queued runs into free slots (never more than --concurrency at once), "
            "heartbeat each at a third of its lease, journal its events, and finish it. Wakes on "
            "NOTIFY runrow_enqueued and polls every --poll seconds as the fallback. Every worker "
            "also reaps runs whose lease expired more than --grace seconds ago (once at boot, then "
            "on a jittered interval). SIGTERM/SIGINT drains: stop claiming, let runs in flight "
            "finish for up to --drain seconds, release the rest (requeued while attempts are "
            "left, else failed), exit 0; a second signal exits at once."
        ),
        epilog="""examples:
  runrow worker --concurrency 8 --tools myapp.tools          # the agent loop, tools from your module
  runrow worker --handler pyworker.worker.echo:handle        # echo metadata.echo back, no model
  runrow worker --concurrency 40 --pool-size 44              # handlers that query the database
  RUNROW_LISTEN_URL=postgresql://app@db/app runrow --database-url postgresql://app@pgbouncer/app worker
  runrow --log-level WARNING worker --metrics-port 9464      # quiet logs, Prometheus metrics

"""
        + ENVIRONMENT,
    )
    # A string default goes through `type` too: a bad RUNROW_CONCURRENCY is a usage error.
    p.add_argument(
        "--concurrency",
        type=in_range("concurrency"),
        default=env_default("RUNROW_CONCURRENCY", "4"),
        help="runs in flight at once, 1 to 1000 (env RUNROW_CONCURRENCY)",
    )
    p.add_argument(
        "--pool-size",
        type=in_range("pool_size"),
        default=None,
        metavar="N",
        help="connections in the pool for claims, journals, endings and handlers' ctx.db, 1 to 1000 "
        "(default: min(concurrency + 4, 32)); at least --concurrency when handlers query the "
        "database, or the runs beyond it wait for a connection. A worker holds at most N + 3 "
        "connections below --concurrency 250: N, 2 for heartbeats (one more per 250 of "
        "concurrency) and 1 LISTEN; N + 4 with --metrics-port, whose scrapes have 1 of their "
        "own (README, For DBAs: max_connections)",
    )
    p.add_argument(
        "--lease",
        type=in_range("lease_seconds"),
        default=30,
        help="lease seconds, 1 to 3600; heartbeats every lease/3",
    )
    p.add_argument(
        "--drain",
        type=in_range("drain_seconds"),
        default=30.0,
        help="drain budget in seconds after SIGTERM, 0 to 86400; the stop takes at most "
        "max(5, min(lease, 10)) s more (README: How long a stop takes)",
    )
    p.add_argument(
        "--poll",
        type=in_range("poll_seconds"),
        default=10.0,
        help="idle poll tick in seconds (fallback for NOTIFY), 0.1 to 86400",
    )
    p.add_argument(
        "--grace",
        type=in_range("grace_seconds"),
        default=30,
        help="seconds past an expired lease before a run is reaped, 0 to 86400",
    )
    p.add_argument(
        "--reap-interval",
        type=in_range("reap_interval"),
        default=15.0,
        help="mean seconds between reaper passes, 0.1 to 86400",
    )
    p.add_argument(
        "--trim-after",
        type=in_range("trim_after", unit=3600),
        default=24.0,
        metavar="HOURS",
        help="the reaper also trims the live journal of runs ended, and the webhook deliveries "
        "delivered, more than HOURS ago (runrow.trim_journal; steps, messages and dead letters "
        "stay); 0 = never, at most 876000 (100 years)",
    )
    p.add_argument(
        "--handler",
        default=env_default("RUNROW_HANDLER", "pyworker.agent:handle"),
        help="run handler as module:function (env RUNROW_HANDLER); "
        "pyworker.worker.echo:handle streams metadata.echo back, for tests",
    )
    p.add_argument(
        "--tools",
        default=env_default("RUNROW_TOOLS"),
        help="module that defines the agent's tools (env RUNROW_TOOLS)",
    )
    p.add_argument(
        "--max-model-calls",
        type=in_range("max_model_calls"),
        default=env_default("RUNROW_MAX_MODEL_CALLS", str(DEFAULT_MAX_MODEL_CALLS)),
        metavar="N",
        help="model calls one run of the agent loop may make, 1 to 100000; a run that would make "
        "more ends failed, once, error max_model_calls: ... (env RUNROW_MAX_MODEL_CALLS)",
    )
    p.add_argument(
        "--worker-id",
        type=worker_id,
        default=None,
        help="name in agent_run.worker_id, 1 to 200 characters (default: host-pid)",
    )
    p.add_argument(
        "--listen-url",
        type=conninfo,
        default=env_default("RUNROW_LISTEN_URL", empty_is_unset=True),
        help="a direct (not pooled) PostgreSQL URL for the LISTEN connection, when --database-url "
        "goes through a transaction pooler such as pgbouncer (env RUNROW_LISTEN_URL; default: the "
        "database URL)",
    )
    p.add_argument(
        "--no-session-limits",
        dest="session_limits",
        action="store_false",
        help="do not send the per-session idle/statement timeouts and TCP keepalives derived from "
        "--lease (for a pooler that refuses the options startup parameter; then set them server-side)",
    )
    p.add_argument(
        "--webhook-secret",
        type=secret("leave it out for a worker that delivers no webhooks"),
        default=env_default("RUNROW_WEBHOOK_SECRET", empty_is_unset=True),
        help="the fleet's HMAC-SHA256 key that signs webhook deliveries (Runrow-Signature), and "
        "from which each user's key is derived; prefer the env RUNROW_WEBHOOK_SECRET (a flag "
        "shows in ps). Without it this worker delivers no webhooks",
    )
    p.add_argument(
        "--webhook-signing",
        type=one_of(*WEBHOOK_SIGNING_MODES),
        metavar="{" + ",".join(WEBHOOK_SIGNING_MODES) + "}",
        default=env_default("RUNROW_WEBHOOK_SIGNING", DEFAULT_WEBHOOK_SIGNING),
        help="what signs a delivery: fleet, the secret itself (receivers verify with it); user, the "
        "key derived from it for the run's user_id (`runrow webhooks user-secret USER_ID`: a "
        "user's key cannot sign for another user's receiver); both, one v1 of each, while "
        "receivers move from the one to the other (env RUNROW_WEBHOOK_SIGNING)",
    )
    p.add_argument(
        "--webhook-previous-secret",
        type=secret("leave it out when no rotation is under way"),
        default=env_default("RUNROW_WEBHOOK_PREVIOUS_SECRET", empty_is_unset=True),
        help="during a rotation of --webhook-secret, the old secret: every delivery also carries "
        "its v1 values, so receivers switch at their own pace (env RUNROW_WEBHOOK_PREVIOUS_SECRET; "
        "README, Webhooks: rotating the secret)",
    )
    p.add_argument(
        "--webhook-timeout",
        type=in_range("webhook_timeout"),
        default=10.0,
        help="seconds one webhook request may take in all, 0.1 to 600; longer is a failed attempt",
    )
    p.add_argument(
        "--webhook-attempts",
        type=in_range("webhook_attempts"),
        default=8,
        help="attempts before a webhook delivery is dead-lettered, 1 to 100",
    )
    p.add_argument(
        "--webhook-backoff",
        type=in_range("webhook_backoff"),
        default=10.0,
        help="seconds before the first retry, doubled after each failure (at most 6 h), 0.1 to 3600",
    )
    p.add_argument(
        "--webhook-poll",
        type=in_range("webhook_poll"),
        default=2.0,
        help="seconds between looks for due webhook retries (new deliveries wake it by NOTIFY)",
    )
    p.add_argument(
        "--webhook-per-receiver",
        type=in_range("webhook_per_receiver"),
        default=env_default("RUNROW_WEBHOOK_PER_RECEIVER", str(DEFAULT_WEBHOOK_PER_RECEIVER)),
        metavar="N",
        help="webhook deliveries in flight to one receiver (scheme://host:port) over the whole fleet, "
        "1 to 1000; the rest wait for one of them to end (env RUNROW_WEBHOOK_PER_RECEIVER)",
    )
    p.add_argument(
        "--webhook-proxy",
        type=_proxy_url,
        default=env_default("RUNROW_WEBHOOK_PROXY", empty_is_unset=True),
        metavar="URL",
        help="send webhook deliveries through this HTTP proxy (http://proxy:3128), e.g. an egress "
        "proxy that allows only public addresses; env RUNROW_WEBHOOK_PROXY. HTTP(S)_PROXY are "
        "not read: a proxy meant for other traffic does not carry webhooks unasked",
    )
    from pyworker.cli.webhook_receivers import add_arguments as add_receiver_arguments

    add_receiver_arguments(p, "worker")
    add_log_format(p, "one object per line with run_id, conversation_id, attempt")
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve Prometheus metrics on GET /metrics at this port (0: any free port, logged); "
        "off by default",
    )
    p.add_argument(
        "--metrics-host",
        type=host_name,
        default=None,
        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0 for a scraper elsewhere); "
        "needs --metrics-port",
    )
    p.set_defaults(func=cmd_worker)

    from pyworker.cli.fake_model import add_command as add_fake_model

    add_fake_model(sub)

    from pyworker.cli.demo import add_command as add_demo

    add_demo(sub)

    # enqueue, tail, stop, cancel, retry, status, audit: the client commands, in their own module.
    from pyworker.cli.client import add_commands

    add_commands(sub)

    # approvals, approve, reject: the person in the loop of irreversible tool calls.
    from pyworker.cli.approvals import add_commands as add_approval_commands

    add_approval_commands(sub)

    # schedules [list | add | remove]: recurring runs, fired by every worker's reaper pass.
    from pyworker.cli.schedules import add_commands as add_schedule_commands

    add_schedule_commands(sub)

    # fork, replay: a recorded run as the start of another, or re-asked of another model.
    from pyworker.cli.replay import add_commands as add_replay_commands

    add_replay_commands(sub)

    # limits, budget: the fleet's rate limits, budgets and prices.
    from pyworker.cli.limits import add_commands as add_limit_commands

    add_limit_commands(sub)

    # concurrency, fairness: the claim's caps per concurrency key and shares per tenant.
    from pyworker.cli.scheduling import add_commands as add_scheduling_commands

    add_scheduling_commands(sub)

    # webhooks user-secret: a user's own key to verify its deliveries.
    from pyworker.cli.webhooks import add_commands as add_webhook_commands

    add_webhook_commands(sub)

    from pyworker.cli.serve import add_command as add_serve

    add_serve(sub)
    name_env_defaults(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    bad = not_utf8(argv)
    if bad is not None:
        parser.error(bad)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("yoyo").setLevel(logging.WARNING)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit, where a closed pipe or a full disk is a traceback
        return code
    except KeyboardInterrupt:
        return 130  # Ctrl-C: the shell's code for SIGINT, without a traceback
    except OSError as exc:
        if exc.errno not in WRITE_ERRORS:
            raise
        # Writing to stdout failed (the reader went away, a full disk): what the command did stands.
        return stdout_lost(exc, args.cmd, "what it did in the database is done")
    except ConfigError as exc:
        print(f"runrow: {exc}", file=sys.stderr)
        return 2
    except MigrateError as exc:
        print(f"runrow migrate: {exc}", file=sys.stderr)
        return 1
    except devdb.DevDbError as exc:
        print(f"runrow: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        # A command without a handler of its own (migrate): the URL cannot be parsed, or the
        # server cannot be reached. One line, as the other commands say it.
        reason = unparsable_url_reason(exc) if isinstance(exc, psycopg.ProgrammingError) else first_line(exc)
        print(f"runrow {args.cmd}: cannot use the database: {reason}", file=sys.stderr)
        return 2
