"""`runrow fake-model`: the fake Messages API as its own process (for the demo and kill tests)."""

from __future__ import annotations

import argparse
import sys
import textwrap

from pyworker.cli.types import host_name, number, port_number


def cmd_fake_model(args: argparse.Namespace) -> int:
    from pyworker.fake.server import serve_forever

    secret = args.secret.encode() if args.secret else None
    try:
        return serve_forever(args.scenario, args.host, args.port, secret, args.delta_delay)
    # The address: unresolvable, not this host's, the port taken, or not a port (OverflowError).
    except (OSError, OverflowError) as exc:
        where = f"--host {args.host} --port {args.port}"
        print(f"runrow fake-model: cannot listen on {where}: {exc}", file=sys.stderr)
        return 2


def add_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from pyworker.fake.scenarios import scenario_names

    p = sub.add_parser(
        "fake-model",
        help="serve a fake Anthropic Messages API on loopback",
        description=textwrap.fill(
            "A real HTTP server speaking the Messages API wire format (streaming and not) with "
            "scripted scenarios, signed thinking blocks and fault injection. Prints its base URL, then "
            "serves until SIGINT/SIGTERM. Point the SDK at it with ANTHROPIC_BASE_URL. Control: POST "
            "/_control/faults, /_control/scenario, /_control/reset; GET /_control/requests.",
            width=88,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""examples:
  runrow fake-model --port 8765 --scenario demo &
  ANTHROPIC_BASE_URL=http://127.0.0.1:8765 ANTHROPIC_API_KEY=test runrow worker""",
    )
    # An empty host bound 0.0.0.0 and :: on two different ports and printed "http://:PORT".
    p.add_argument(
        "--host",
        type=host_name,
        default="127.0.0.1",
        help="address to bind (default %(default)s; the fake takes no token: keep it on loopback)",
    )
    p.add_argument("--port", type=port_number, default=0, help="0 picks a free port (default)")
    p.add_argument(
        "--scenario",
        default="demo",
        choices=scenario_names(),
        help="scripted answers to serve (default %(default)s; POST /_control/scenario changes it)",
    )
    p.add_argument("--secret", help="thinking-signature key (default: a fixed key, stable across restarts)")
    p.add_argument(
        "--delta-delay",
        type=number(float, 0, 60, "seconds"),
        default=0.0,
        help="seconds before each streamed event, to see a stream (default %(default)s)",
    )
    p.set_defaults(func=cmd_fake_model)
