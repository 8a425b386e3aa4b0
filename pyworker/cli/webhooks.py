"""`runrow webhooks user-secret USER_ID`: the key a user verifies its webhook deliveries with.

Derived from the fleet secret (pyworker.worker.webhook_signing), so nothing is stored and nothing
needs the database: the operator runs it where RUNROW_WEBHOOK_SECRET is set, as on the workers.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from pyworker.cli.types import env_default, secret

# The range enqueue_run takes: no run has another user_id, so a key for one would verify nothing.
MAX_USER_ID = 200

DESCRIPTION = """\
Print the key that signs the deliveries of USER_ID's runs when the workers run with
--webhook-signing user (or both). Give it to that user, and to no one else: it verifies that
user's deliveries, and signs them too, but no other user's, and it does not reveal the fleet
secret. Derived from the fleet secret (RUNROW_WEBHOOK_SECRET, as the workers have it), never
stored: the same secret gives the same key, a new secret (a rotation) a new one.

USER_ID is taken exactly as the runs' user_id, which the delivery body carries (no trimming,
no case folding, no Unicode normalisation). --no-user: the key of the runs that have no user.

Derivation, for other languages (UTF-8 throughout; the whole result, "whsec_" included, is the
key a receiver passes to its HMAC):
  "whsec_" + hex(HMAC-SHA256(key=fleet secret, msg="runrow-webhook-user:" + USER_ID))
  "whsec_" + hex(HMAC-SHA256(key=fleet secret, msg="runrow-webhook-no-user"))   (--no-user)"""

EPILOG = """\
examples:
  RUNROW_WEBHOOK_SECRET=… runrow webhooks user-secret alice     # prints whsec_…
  runrow webhooks user-secret --no-user                         # the runs enqueued without a user

exit codes: 0 printed, 2 no fleet secret or a bad USER_ID (nothing printed).
The fleet secret itself is never printed."""


def cmd_user_secret(args: argparse.Namespace) -> int:
    from pyworker.worker.webhook_signing import derive_user_secret

    if not args.webhook_secret:
        print(
            "runrow webhooks user-secret: no fleet secret: set RUNROW_WEBHOOK_SECRET to the workers' "
            "--webhook-secret (or pass --webhook-secret, which ps shows)",
            file=sys.stderr,
        )
        return 2
    print(derive_user_secret(args.webhook_secret, None if args.no_user else args.user_id))
    return 0


def _user_id(text: str) -> str:
    if not 1 <= len(text) <= MAX_USER_ID:
        raise argparse.ArgumentTypeError(
            f"must be 1 to {MAX_USER_ID} characters, as a run's user_id, got {len(text)} "
            "(--no-user: the key of the runs without a user)"
        )
    return text


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "webhooks",
        help="webhook signing keys: user-secret USER_ID prints a user's key",
        description=textwrap.fill(
            "Webhook deliveries are signed with the fleet secret (--webhook-secret), with the key "
            "derived from it for the run's user (--webhook-signing user), or both (README, "
            "Webhooks). user-secret prints a user's key.",
            width=88,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  runrow webhooks user-secret alice",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser(
        "user-secret",
        help="print the key that signs USER_ID's deliveries (--webhook-signing user)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    who = q.add_mutually_exclusive_group(required=True)
    who.add_argument("user_id", nargs="?", type=_user_id, metavar="USER_ID", help="the runs' user_id")
    who.add_argument("--no-user", action="store_true", help="the key of the runs that have no user_id")
    q.add_argument(
        "--webhook-secret",
        type=secret("set the fleet secret the workers sign with"),
        default=env_default("RUNROW_WEBHOOK_SECRET", empty_is_unset=True),
        metavar="SECRET",
        help="the fleet secret (default: $RUNROW_WEBHOOK_SECRET; prefer it: a flag shows in ps)",
    )
    q.set_defaults(func=cmd_user_secret)
