"""Who can sign a webhook delivery for whom (README "Webhooks": who can sign, a user's key,
rotating the secret). Real `runrow worker` processes deliver real runs of several users to a
loopback receiver per user; each request is verified with the keys the README says, computed here
from the README's derivation (not from the module's), and with the key `runrow webhooks
user-secret` prints. Under `--webhook-signing fleet` (until now the only way) a delivery to one
user verified with the one fleet secret every user held: any user could forge another's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from test_webhooks import FAST, Received, Receiver, state, workers
from worker_support import REPO, db, wait_until, worker_db

from pyworker.worker.webhooks import SignatureError, verify_signature

__all__ = ["db", "worker_db", "workers"]

FLEET = "c0ffee" * 6  # 36 characters: no warning of a short secret
OLD = "0ld5ec" * 6
ALICE = "alice"
# Non-ASCII, a quote and a backslash: the JSON body escapes them; the key is the decoded user_id.
ZOE = 'zoë "z" \\ ü'


def readme_key(secret: str, user_id: str | None) -> str:
    """A user's key as README "Webhooks" spells it for other languages."""
    msg = "runrow-webhook-no-user" if user_id is None else "runrow-webhook-user:" + user_id
    return "whsec_" + hmac.new(secret.encode(), msg.encode(), hashlib.sha256).hexdigest()


def verifies(key: str, got: Received) -> bool:
    try:
        verify_signature(key, got.headers.get("Runrow-Signature"), got.body)
    except SignatureError:
        return False
    return True


def user_secret(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`runrow webhooks user-secret ARGS` with `env` over this one's (its fleet secret left out)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNROW_WEBHOOK")}
    return subprocess.run(
        [sys.executable, "-m", "pyworker", "webhooks", "user-secret", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=30,
        cwd=REPO,
    )


def v1_count(got: Received) -> int:
    return got.headers["Runrow-Signature"].count("v1=")


@pytest.fixture
def receivers() -> Iterator[dict[str | None, Receiver]]:
    """One receiver per user (None: the runs without one)."""
    made = {user: Receiver([]) for user in (ALICE, ZOE, None)}
    yield made
    for r in made.values():
        r.close()


def deliver_one_each(
    db: psycopg.Connection, receivers: dict[str | None, Receiver]
) -> dict[str | None, Received]:
    """A run of each user, hooked to that user's receiver, ended and delivered: its request."""
    runs = {}
    for user, receiver in receivers.items():
        row = db.execute(
            "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => %s, model => 'echo', "
            "metadata => %s, webhook_url => %s, user_id => %s)",
            (uuid.uuid4(), Jsonb("hi"), Jsonb({"echo": "hi", "duration": 0.01}), receiver.url, user),
        ).fetchone()
        assert row is not None
        runs[user] = row[0]
    wait_until(lambda: all(state(db, r) == "delivered" for r in runs.values()), 30, "a delivery to each user")
    got = {}
    for user, receiver in receivers.items():
        [got[user]] = receiver.requests
        assert json.loads(got[user].body)["user_id"] == user
    return got


def test_under_user_signing_a_delivery_verifies_with_its_users_key_and_no_other(
    db: psycopg.Connection, workers: Any, receivers: dict[str | None, Receiver]
) -> None:
    """Before: the header's one v1 verified with the fleet secret, which every user held to
    verify its own webhooks, so any user could sign for any receiver and a delivery replayed
    to another user's receiver verified there. The mode is set by its variable, so the old
    worker starts too (and ignores it)."""
    w = workers("w1", *FAST, env={"RUNROW_WEBHOOK_SECRET": FLEET, "RUNROW_WEBHOOK_SIGNING": "user"})
    got = deliver_one_each(db, receivers)
    for user, request in got.items():
        assert verifies(readme_key(FLEET, user), request), f"{user!r}'s key verifies its delivery"
        assert not verifies(FLEET, request), "the fleet secret signs nothing"
        for other in receivers:
            if other != user:  # replayed to another user's receiver: refused there
                assert not verifies(readme_key(FLEET, other), request), (user, other)
        assert v1_count(request) == 1
    # What a user's key can sign, another user's receiver refuses.
    forged = json.dumps({"user_id": ALICE, "status": "completed"}).encode()
    now = int(time.time())
    from pyworker.worker.webhook_signing import signature_header

    header = signature_header(readme_key(FLEET, ZOE), now, forged)
    with pytest.raises(SignatureError):
        verify_signature(readme_key(FLEET, ALICE), header, forged, now=now)
    assert "signed with each user's key" in w.log()

    # The operator's command prints the key the worker signed with, never the fleet secret.
    for user, args in ((ALICE, [ALICE]), (ZOE, [ZOE]), (None, ["--no-user"])):
        printed = user_secret(*args, env={"RUNROW_WEBHOOK_SECRET": FLEET})
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout == readme_key(FLEET, user) + "\n"
        assert verifies(printed.stdout.strip(), got[user])
        assert FLEET not in printed.stdout + printed.stderr


def test_both_signs_with_the_fleet_secret_and_the_users_key(
    db: psycopg.Connection, workers: Any, receivers: dict[str | None, Receiver]
) -> None:
    workers("w1", *FAST, "--webhook-signing", "both", env={"RUNROW_WEBHOOK_SECRET": FLEET})
    got = deliver_one_each(db, receivers)
    for user, request in got.items():
        assert v1_count(request) == 2
        assert verifies(FLEET, request) and verifies(readme_key(FLEET, user), request), user
        assert not any(verifies(readme_key(FLEET, other), request) for other in receivers if other != user)


@pytest.mark.parametrize(
    ("mode", "keys"),
    [
        ("fleet", lambda user: [FLEET, OLD]),
        ("user", lambda user: [readme_key(FLEET, user), readme_key(OLD, user)]),
        ("both", lambda user: [FLEET, readme_key(FLEET, user), OLD, readme_key(OLD, user)]),
    ],
)
def test_during_a_rotation_a_delivery_verifies_with_the_new_and_the_old_key(
    db: psycopg.Connection, workers: Any, receivers: dict[str | None, Receiver], mode: str, keys: Any
) -> None:
    """Before: one v1, of the current secret, and a receiver on the old one failed every
    delivery from the restart on. The previous secret is given by its variable, so the old
    worker starts too (and ignores it)."""
    w = workers(
        "w1",
        *FAST,
        env={
            "RUNROW_WEBHOOK_SECRET": FLEET,
            "RUNROW_WEBHOOK_PREVIOUS_SECRET": OLD,
            "RUNROW_WEBHOOK_SIGNING": mode,
        },
    )
    got = deliver_one_each(db, receivers)
    for user, request in got.items():
        expected = keys(user)
        assert all(verifies(k, request) for k in expected), (mode, user)
        assert v1_count(request) == len(expected), request.headers["Runrow-Signature"]
        if mode == "user":
            assert not verifies(FLEET, request) and not verifies(OLD, request)
    assert "and the previous secret's (a rotation)" in w.log()
    assert FLEET not in w.log() and OLD not in w.log()


def test_derive_user_secret_is_the_readmes_derivation_and_its_example() -> None:
    from pyworker.worker.webhook_signing import derive_user_secret

    for user in (ALICE, ZOE, "Zoe\u0308", None):
        assert derive_user_secret(FLEET, user) == readme_key(FLEET, user)
    assert derive_user_secret(FLEET, "Zo\u00eb") != derive_user_secret(FLEET, "Zoe\u0308")  # not normalised
    readme = (Path(REPO) / "README.md").read_text()
    assert derive_user_secret("s3cret", ALICE) in readme and derive_user_secret("s3cret", None) in readme
    for secret, user in (("", ALICE), (FLEET, "")):
        with pytest.raises(ValueError):
            derive_user_secret(secret, user)


def test_signature_header_carries_one_v1_per_key_each_once() -> None:
    from pyworker.worker.webhook_signing import signature_header

    body, now = b'{"id":"x"}', 1_800_000_000
    header = signature_header([FLEET, OLD, FLEET], now, body)
    assert header.startswith(f"t={now},v1=") and header.count("v1=") == 2
    assert verify_signature(OLD, header, body, now=now) == verify_signature(FLEET, header, body, now=now)
    assert signature_header(FLEET, now, body) == signature_header([FLEET], now, body)


def test_the_user_of_a_payload_python_cannot_decode_is_found_and_a_bad_one_is_unsendable() -> None:
    """A payload written before migration 0069, nested past Python's recursion limit, is sent as
    the database's text; its user_id is read from that text, or no user's key could sign it.
    A user_id that is no user id (a payload written by hand) ends the delivery at once under
    users' keys (a deterministic failure), and changes nothing under the fleet secret."""
    from pyworker.worker.webhooks import Unsendable, WebhookSettings, body_and_user

    deep = '{"result": {"a": ' + "[" * 3000 + "]" * 3000 + ', "s": "}\\"]"}, "user_id": "zo\\u00eb", "z": 1}'
    body, user = body_and_user(deep)
    assert (body, user) == (deep.encode(), "zoë")
    assert body_and_user('{"user_id": null}')[1] is None
    user_keys = WebhookSettings(secret=FLEET, signing="user")
    assert user_keys.keys_for(user) == [readme_key(FLEET, "zoë")]
    for bad in ('{"user_id": 7}', '{"user_id": ""}', '{"user_id": ' + "[" * 3000 + "]" * 3000 + "}"):
        user = body_and_user(bad)[1]
        with pytest.raises(Unsendable, match="user_id is not a user id"):
            user_keys.keys_for(user)
        assert WebhookSettings(secret=FLEET).keys_for(user) == [FLEET]


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        ([ALICE], {}, "no fleet secret: set RUNROW_WEBHOOK_SECRET"),
        ([ALICE], {"RUNROW_WEBHOOK_SECRET": ""}, "no fleet secret: set RUNROW_WEBHOOK_SECRET"),
        ([""], {"RUNROW_WEBHOOK_SECRET": FLEET}, "argument USER_ID: must be 1 to 200 characters"),
        (["x" * 201], {"RUNROW_WEBHOOK_SECRET": FLEET}, "argument USER_ID: must be 1 to 200 characters"),
        ([], {"RUNROW_WEBHOOK_SECRET": FLEET}, "one of the arguments USER_ID --no-user is required"),
        ([ALICE, "--no-user"], {"RUNROW_WEBHOOK_SECRET": FLEET}, "not allowed with argument USER_ID"),
        ([ALICE, "--webhook-secret", ""], {}, "argument --webhook-secret: must not be empty"),
        # Bytes that are not UTF-8 are no HMAC key: the worker raised at every signature.
        ([ALICE], {"RUNROW_WEBHOOK_SECRET": os.fsdecode(b"s\xffx")}, "--webhook-secret: must be UTF-8 text"),
    ],
)
def test_user_secret_without_a_secret_or_a_user_is_exit_2_and_prints_no_key(
    args: list[str], env: dict[str, str], says: str
) -> None:
    done = user_secret(*args, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert FLEET not in done.stderr
