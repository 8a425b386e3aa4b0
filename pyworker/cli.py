"""`runrow` command line. Each subcommand is a small function; argparse does the rest."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys

from pyworker import devdb
from pyworker.config import ConfigError, database_url
from pyworker.migrate import MigrateError

DESCRIPTION = """\
runrow: durable AI-agent runs on plain PostgreSQL. A run is a row: enqueued, claimed,
leased, fenced, journaled, resumed and stopped by the runrow.* SQL functions.

Every command that talks to the database takes --database-url, else DATABASE_URL,
else the cluster started by `runrow db start`.
"""


def cmd_migrate(args: argparse.Namespace) -> int:
    from pyworker.migrate import migrate

    result = migrate(database_url(args.database_url))
    applied = ", ".join(result.applied) or "none (already current)"
    print(f"migrations applied: {applied}")
    print(f"functions re-applied: {len(result.functions)}")
    print(f"schema version: {result.version}")
    return 0


def cmd_db(args: argparse.Namespace) -> int:
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
    if os.environ.get("DATABASE_URL"):
        return subprocess.call(command)
    with devdb.throwaway() as cluster:
        env = dict(os.environ, DATABASE_URL=cluster.url, RUNROW_SUPERUSER_URL=cluster.superuser_url)
        return subprocess.call(command, env=env)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runrow", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL)")
    parser.add_argument("--log-level", default=os.environ.get("RUNROW_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "migrate",
        help="install or upgrade the runrow schema and functions",
        description="Apply pending migrations (yoyo) and re-apply every file in "
        "functions/. Safe to run from several processes at once.",
    )
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "db",
        help="a throwaway PostgreSQL cluster for development",
        description="start: create a private cluster from the PostgreSQL 15 binaries "
        "and print its URL (kept in .runrow/db.json). stop: remove it. url: print it. "
        "run -- CMD: run CMD with DATABASE_URL set to a cluster that lives only as "
        "long as CMD (unless DATABASE_URL is already set).",
    )
    p.add_argument("action", choices=["start", "stop", "url", "run"])
    p.add_argument("command", nargs=argparse.REMAINDER, help="for run: the command to run")
    p.set_defaults(func=cmd_db)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("yoyo").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"runrow: {exc}", file=sys.stderr)
        return 2
    except MigrateError as exc:
        print(f"runrow migrate: {exc}", file=sys.stderr)
        return 1
    except devdb.DevDbError as exc:
        print(f"runrow: {exc}", file=sys.stderr)
        return 2
