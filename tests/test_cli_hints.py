"""What the client commands say when they cannot do what was asked: each error line says what to
do next (a login without grants, a conversation of another user, a conversation's id given for
a run's, a database without runrow), as real processes but where noted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from tail_support import enqueue, private_database_url
from test_cli import conn, runrow

import pyworker.cli.client
from pyworker.cli.main import main
from pyworker.db.devdb import temporary_database

__all__ = ["conn", "private_database_url"]  # the fixtures, for pytest


@pytest.fixture
def login(conn: psycopg.Connection) -> Iterator[str]:
    """A login role of its own, granted nothing (roles are the cluster's: dropped afterwards)."""
    name = f"runrow_test_login_{uuid.uuid4().hex[:10]}"
    conn.execute(f'CREATE ROLE "{name}" LOGIN')
    try:
        yield name
    finally:
        conn.execute(f'DROP ROLE "{name}"')


def test_a_login_without_grants_is_told_which_role_to_grant(
    private_database_url: str, conn: psycopg.Connection, login: str
) -> None:
    """worker and serve said to GRANT runrow_worker / runrow_client; the client commands said
    only `database error 42501: permission denied for schema runrow`."""
    url = make_conninfo(private_database_url, user=login)
    for args in (["status"], ["enqueue", "hi"], ["cancel", str(uuid.uuid4())], ["tail", str(uuid.uuid4())]):
        done = runrow(url, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr == (
            "runrow: permission denied for schema runrow: this login has no runrow role: GRANT "
            "runrow_client TO it (and runrow_auditor for `status`, `audit` and the `show` actions)\n"
        ), args
    conn.execute(f'GRANT runrow_client TO "{login}"')
    status = runrow(url, "status")  # queue_health is the auditor's
    assert status.returncode == 2
    assert status.stderr == (
        "runrow: permission denied for view queue_health: the runrow views are runrow_auditor's to "
        "read: GRANT runrow_auditor TO this login\n"
    )
    assert runrow(url, "enqueue", "hi").returncode == 0  # the client's own commands go through


def test_a_turn_for_a_conversation_of_a_user_says_to_pass_the_user(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    """The README's `schedules add ... -c $CONV` on a conversation that has a user failed with
    only `database error 42501: conversation_id … belongs to another user`."""
    started = runrow(private_database_url, "enqueue", "hi", "--user", "alice")
    assert started.returncode == 0, started.stderr
    conversation = started.stderr.split()[1]
    said = (
        f"runrow: conversation_id {conversation} belongs to another user: pass --user OWNER, the user "
        "the conversation was started for\n"
    )
    for args in (
        ["schedules", "add", "s1", "@daily", "hi", "-c", conversation],
        ["enqueue", "-c", conversation, "hi"],
    ):
        done = runrow(private_database_url, *args)
        assert (done.returncode, done.stderr) == (2, said), args
    added = runrow(
        private_database_url, "schedules", "add", "s1", "@daily", "hi", "-c", conversation, "--user", "alice"
    )
    assert added.returncode == 0, added.stderr
    assert runrow(private_database_url, "schedules", "remove", "s1").returncode == 0


@pytest.mark.parametrize("command", ["cancel", "tail", "status", "retry"])
def test_a_conversations_id_given_for_a_run_says_so(
    private_database_url: str, conn: psycopg.Connection, command: str
) -> None:
    """`stop` given a run's id names `cancel`; the run commands given a conversation's id said
    only that no run has it."""
    conversation = uuid.uuid4()
    active = enqueue(conn, conversation_id=conversation)  # queued: cancelled by the fixture
    done = runrow(private_database_url, command, str(conversation))
    assert done.returncode == 2
    assert done.stderr == (
        f"runrow: run {conversation} does not exist: {conversation} is a conversation, not a run "
        f"(`runrow stop {conversation}` stops its runs; its active run is {active})\n"
    )


def test_tail_on_a_database_without_runrow_says_one_line_and_starts_no_hub(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, to see the hub: started before the schema was checked, it raced the tail's
    own error and, when it won, wrote `WARNING runrow.hub hub cannot watch run journals (schema
    "runrow" does not exist LINE 1: ...` over several lines before it."""
    started: list[str] = []

    class NoHub(pyworker.cli.client.Hub):
        async def start(self) -> None:
            started.append("hub")
            await super().start()

    monkeypatch.setattr(pyworker.cli.client, "Hub", NoHub)
    with temporary_database(database_url, "runrow_cli_empty", migrated=False) as empty:
        assert main(["--database-url", empty, "tail", str(uuid.uuid4())]) == 2
    assert started == []
    assert capsys.readouterr().err == (
        'runrow: schema "runrow" does not exist: is runrow installed here? run `runrow migrate` on '
        "this database\n"
    )
