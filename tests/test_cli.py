"""The client commands of `runrow`, run as real processes: output, exit codes, error lines."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from tail_support import append, claim, enqueue, finish, finished_run, private_database_url
from worker_support import REPO

from pyworker.cli.main import build_parser
from pyworker.db.devdb import temporary_database

__all__ = ["private_database_url"]  # the fixture, re-exported for pytest

COMMANDS = ["enqueue", "tail", "stop", "cancel", "retry", "status", "audit"]


def runrow(
    url: str | None, *args: str, stdin: str | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if url is not None:
        env["DATABASE_URL"] = url
    env["NO_COLOR"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pyworker", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )


@pytest.fixture
def conn(private_database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(private_database_url, autocommit=True) as c:
        yield c
        # Claims take the oldest queued run: leave none behind for the next test's claim.
        for (run_id,) in c.execute("SELECT id FROM runrow.agent_run WHERE status = 'queued'").fetchall():
            c.execute("SELECT runrow.cancel_run(run_id => %s)", (run_id,))


def dead_run(conn: psycopg.Connection) -> uuid.UUID:
    run_id = enqueue(conn, max_attempts=2)
    for expected in ("requeued", "dead"):
        token = claim(conn, run_id)
        row = conn.execute(
            "SELECT runrow.release_run(run_id => %s, claim_token => %s)", (run_id, token)
        ).fetchone()
        assert row is not None and row[0] == expected
    return run_id


def test_help_of_runrow_and_every_client_command() -> None:
    top = runrow(None, "--help")
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
    for command in COMMANDS:
        result = runrow(None, command, "--help")
        assert result.returncode == 0, result.stderr
        assert "example" in result.stdout, f"{command} --help teaches by example"


def test_version_names_the_package_and_the_schema_it_needs() -> None:
    """`runrow --version` answered "the following arguments are required: COMMAND" (exit 2): an
    operator had no way to ask which runrow a host runs, nor which schema it needs, which a
    worker compares with the database's runrow.schema_version() at start (the CLI audit)."""
    newest = sorted((REPO / "migrations").glob("*.sql"))[-1].stem
    declared = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert declared is not None
    result = runrow(None, "--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"runrow {declared[1]} (schema {newest})"), (
        result
    )


def test_help_loads_neither_the_sdk_nor_the_worker() -> None:
    """Importing the anthropic SDK takes about 1.7 s, and the worker's modules (httpx, the pool,
    the dispatcher) about 0.2 s: `runrow --help` took 2.7 s, because the parser's module for fork
    and replay imported the SDK and the worker flags' ranges were read from the worker's module.
    Building the parser and printing any command's help now loads neither; replay loads the SDK
    when it runs, a worker its handler and itself. Counted by module, not by clock."""
    probe = (
        "import sys\n"
        "from pyworker.cli.main import main\n"
        "for argv in (['--help'], *[[c, '--help'] for c in sys.argv[1:]]):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('anthropic', 'pyworker.worker.process', 'pyworker.worker.webhooks', 'httpx')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *COMMANDS, "worker", "serve", "replay", "fork", "limits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and nested action of the CLI (`db`, `db start`, `limits set`, ...)."""
    found: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += [(*path, name), *commands(child, (*path, name))]
    return found


def test_every_subcommand_parses_help_in_process_and_teaches_by_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Covers the commands other modules add too (worker, db, migrate, ...), and their actions.
    parser = build_parser()
    found = commands(parser)
    assert {("db", "start"), ("db", "stop"), ("limits", "set"), ("worker",)} <= set(found)
    without = []
    for path in found:
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([*path, "--help"])
        assert exc.value.code == 0, path
        if "example" not in capsys.readouterr().out:
            without.append(" ".join(path))
    assert without == [], "every --help shows an example (README: the CLI)"


def test_db_actions_take_help_and_refuse_what_they_do_not_take(capsys: pytest.CaptureFixture[str]) -> None:
    """`db stop --help` used to stop and remove the cluster, and `db start --help` start one:
    `--help` after the action was swallowed as `run`'s command."""
    parser = build_parser()
    for action in ("start", "stop", "url"):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["db", action, "now"])
        assert exc.value.code == 2
        assert "unrecognized arguments: now" in capsys.readouterr().err
    args = parser.parse_args(["db", "run", "--", "pytest", "--help"])
    assert (args.action, args.command) == ("run", ["--", "pytest", "--help"])
    assert parser.parse_args(["db", "run", "pytest", "-q"]).command == ["pytest", "-q"]


@pytest.mark.parametrize(("status", "code"), [("completed", 0), ("failed", 1), ("cancelled", 3), ("dead", 4)])
def test_tail_of_a_finished_run_prints_text_and_exits_with_its_status(
    private_database_url: str, conn: psycopg.Connection, status: str, code: int
) -> None:
    if status == "dead":
        run_id = dead_run(conn)
    else:
        run_id = finished_run(conn, ["Hello", ", ", "world"], status=status)
    result = runrow(private_database_url, "tail", str(run_id))
    assert result.returncode == code, result.stderr
    if status == "completed":
        assert result.stdout == "Hello, world"  # piped: exactly the answer, no newline added
    elif status != "dead":
        # No result kept the text (finish_run without one): no answer on stdout, a note instead.
        assert result.stdout == "" and "not kept by the run's result: Hello, world" in result.stderr
    assert f"complete status={status}" in result.stderr
    assert "1 user_message_created" in result.stderr


def test_tail_from_a_cursor_prints_only_what_follows(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    run_id = finished_run(conn, ["one ", "two ", "three"])  # seqs: 1-3 queue+claim, 4-6 text, 7 complete
    result = runrow(private_database_url, "tail", str(run_id), "--from", "4")
    assert result.returncode == 0
    assert result.stdout == "two three"
    # Past the end: nothing more to show, and the exit code still says how it ended.
    result = runrow(private_database_url, "tail", str(run_id), "--from", "7")
    assert result.returncode == 0 and result.stdout == ""
    assert "status=completed" in result.stderr


def test_tail_of_a_trimmed_run_prints_its_result_text(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    """trim_journal deletes the deltas; read_events ends the journal with a complete built from
    the run row, which carries result.text. The tail printed nothing on stdout (the history
    audit): the README promises `runrow tail RUN > answer.txt` gives exactly result.text."""
    run_id = enqueue(conn)
    token = claim(conn, run_id)
    append(conn, run_id, token, [{"type": "text_delta", "text": t} for t in ("Hel", "lo")])
    conn.execute(
        "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'completed', result => %s)",
        (run_id, token, Jsonb({"text": "Hello"})),
    )
    before = runrow(private_database_url, "tail", str(run_id))
    conn.execute("SELECT runrow.trim_journal(older_than => interval '0')")
    after = runrow(private_database_url, "tail", str(run_id))
    assert (before.returncode, before.stdout) == (0, "Hello")
    assert (after.returncode, after.stdout) == (0, "Hello"), after.stderr
    # A cursor from before the trim cannot be continued exactly: no text is made up for it.
    resumed = runrow(private_database_url, "tail", str(run_id), "--from", "3")
    assert resumed.returncode == 0 and resumed.stdout == "" and "complete status=completed" in resumed.stderr


def test_enqueue_prints_the_run_id_and_the_conversation(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    conversation = uuid.uuid4()
    result = runrow(
        private_database_url,
        "enqueue",
        "-c",
        str(conversation),
        "-",
        "--model",
        "m-1",
        "--system",
        "Be brief.",
        "--metadata",
        '{"k": "v"}',
        "--max-attempts",
        "3",
        stdin="from stdin",
    )
    assert result.returncode == 0, result.stderr
    run_id = uuid.UUID(result.stdout.strip())
    assert str(conversation) in result.stderr
    row = conn.execute(
        "SELECT conversation_id, status, model, max_attempts FROM runrow.get_run(run_id => %s)", (run_id,)
    ).fetchone()
    assert row == (conversation, "queued", "m-1", 3)
    # The same idempotency key returns the same run, and says so.
    other = str(uuid.uuid4())
    again = [
        runrow(private_database_url, "enqueue", "x", "-c", other, "--idempotency-key", "k-1")
        for _ in range(2)
    ]
    assert again[0].returncode == again[1].returncode == 0, again[1].stderr
    assert again[0].stdout == again[1].stdout
    assert "existing run" in again[1].stderr
    # Reused by another conversation: refused, in one line, exit 2.
    clash = runrow(private_database_url, "enqueue", "x", "--idempotency-key", "k-1")
    assert (
        clash.returncode == 2 and clash.stderr.startswith("runrow: ") and "--idempotency-key" in clash.stderr
    )
    # Without -c, a new conversation with a time-ordered id (UUIDv7, pyworker/db/ids.py).
    fresh = runrow(private_database_url, "enqueue", "x")
    assert fresh.returncode == 0, fresh.stderr
    (conversation,) = conn.execute(
        "SELECT conversation_id FROM runrow.get_run(run_id => %s)", (uuid.UUID(fresh.stdout.strip()),)
    ).fetchone()
    assert conversation.version == 7 and str(conversation) in fresh.stderr


def test_enqueue_follow_streams_until_the_run_ends(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyworker", "enqueue", "tell me", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DATABASE_URL": private_database_url, "NO_COLOR": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        if not first:
            raise AssertionError(f"enqueue --follow printed no run id: {proc.communicate(timeout=10)}")
        run_id = uuid.UUID(first)

        def worker() -> None:
            with psycopg.connect(private_database_url, autocommit=True) as w:
                token = claim(w, run_id)
                append(w, run_id, token, [{"type": "text_delta", "text": "streamed "}])
                append(w, run_id, token, [{"type": "text_delta", "text": "answer"}])
                finish(w, run_id, token, "failed", error="boom")

        thread = threading.Thread(target=worker)
        thread.start()
        out, err = proc.communicate(timeout=30)
        thread.join()
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    # Piped, stdout is the answer: a run that failed with no result has none; the text is a note.
    assert out == "" and "not kept by the run's result: streamed answer" in err
    assert "complete status=failed error=boom" in err


def test_a_retried_keyed_enqueue_without_a_conversation_returns_the_first_run(
    private_database_url: str,
) -> None:
    """Each call made a new conversation, so the retry a key is for was refused as another request."""
    key = f"digest-{uuid.uuid4()}"
    first = runrow(private_database_url, "enqueue", "weekly digest", "--idempotency-key", key)
    again = runrow(private_database_url, "enqueue", "weekly digest", "--idempotency-key", key)
    assert (first.returncode, again.returncode) == (0, 0), again.stderr
    assert again.stdout == first.stdout and "existing run for this idempotency key" in again.stderr
    other = runrow(private_database_url, "enqueue", "another text", "--idempotency-key", key)
    assert other.returncode == 2 and "already used" in other.stderr
    conversation = first.stderr.split()[1]  # "conversation <id>"
    assert runrow(private_database_url, "stop", conversation).returncode == 0  # leave no queued run behind


def test_stop_and_cancel(private_database_url: str, conn: psycopg.Connection) -> None:
    conversation = uuid.uuid4()
    queued = enqueue(conn, conversation_id=conversation)
    result = runrow(private_database_url, "stop", str(conversation))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{queued}\tcancelled\n"
    assert runrow(private_database_url, "tail", str(queued)).returncode == 3

    result = runrow(private_database_url, "stop", str(conversation))
    assert result.returncode == 0 and result.stdout == "" and "nothing to stop" in result.stderr
    # An id that names no conversation exited 0 having stopped nothing, a run's id among them.
    unknown = runrow(private_database_url, "stop", str(uuid.uuid4()))
    assert unknown.returncode == 2 and "does not exist" in unknown.stderr, unknown.stderr
    a_run = runrow(private_database_url, "stop", str(queued))
    assert a_run.returncode == 2 and f"runrow cancel {queued}" in a_run.stderr, a_run.stderr

    running = enqueue(conn)
    claim(conn, running)
    result = runrow(private_database_url, "cancel", str(running))
    assert (result.returncode, result.stdout) == (0, "cancel_requested\n")
    result = runrow(private_database_url, "cancel", str(queued))
    assert (result.returncode, result.stdout) == (0, "already_cancelled\n")


def test_retry_prints_the_new_run(private_database_url: str, conn: psycopg.Connection) -> None:
    failed = finished_run(conn, [], status="failed")
    result = runrow(private_database_url, "retry", str(failed))
    assert result.returncode == 0, result.stderr
    new = uuid.UUID(result.stdout.strip())
    assert new != failed
    conn.execute("SELECT runrow.cancel_run(run_id => %s)", (new,))  # out of the way of the next claim
    completed = finished_run(conn, [])
    result = runrow(private_database_url, "retry", str(completed))
    assert result.returncode == 2
    assert result.stderr.startswith("runrow: wrong state:") and "only failed or dead" in result.stderr


@pytest.mark.parametrize("command", ["tail", "cancel", "retry"])
def test_unknown_run_is_a_clear_error(private_database_url: str, command: str) -> None:
    missing = uuid.uuid4()
    result = runrow(private_database_url, command, str(missing))
    assert result.returncode == 2
    assert result.stderr == f"runrow: run {missing} does not exist\n"


def test_bad_input_is_one_line_and_exit_2(private_database_url: str, tmp_path: Path) -> None:
    bad_utf8, deep, digits = tmp_path / "latin1.json", tmp_path / "deep.json", tmp_path / "digits.json"
    bad_utf8.write_bytes(b'[{"name": "caf\xe9"}]')
    deep.write_text(DEEP)
    digits.write_text("[" + "9" * 5000 + "]")
    for args, expected in [
        (["enqueue", "x", "--model", ""], "runrow: invalid argument: --model must"),
        (["enqueue", ""], "runrow: the message is empty"),
        (["enqueue", "x", "--tools-json", "/nonexistent.json"], "runrow: cannot read --tools-json"),
        (["tail", str(uuid.uuid4()), "--from", "-1"], "runrow: --from must be"),
        (["enqueue", "x", "--tools-json", str(bad_utf8)], "runrow: --tools-json"),
        (["enqueue", "x", "--tools-json", str(deep)], "runrow: --tools-json"),
        (["enqueue", "x", "--tools-json", str(digits)], "runrow: --tools-json"),
    ]:
        result = runrow(private_database_url, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith(expected), (args, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr


DEEP = "[" * 60_000 + "]" * 60_000

# Found by fuzzing the commands (stop 49): each of these ended in a traceback.
REFUSED_BEFORE_ANY_WORK: list[tuple[list[str | bytes], dict[str, str], int, str]] = [
    (["--log-level", "FOO", "status"], {}, 2, "argument --log-level: must be one of DEBUG, INFO"),
    (["status"], {"RUNROW_LOG_LEVEL": "bogus"}, 2, "argument --log-level: must be one of DEBUG, INFO"),
    (["enqueue", "hi", "--model", b"a\xffb"], {}, 2, "the value of --model is not valid UTF-8: b'a\\xffb'"),
    ([b"--database-url=\xff", "status"], {}, 2, "the value of --database-url is not valid UTF-8"),
    (
        ["enqueue", "hi", "--start-in", "nan"],
        {},
        2,
        "--start-in: must be a number from 0.001 to 31622400",
    ),
    (["enqueue", "hi", "--start-in", "1e300"], {}, 2, "argument --start-in: must be a number"),
    (
        ["enqueue", "hi", "--metadata", '{"a": ' + DEEP + "}"],
        {},
        2,
        "--metadata: not JSON this command",
    ),
    (
        ["enqueue", "hi", "--max-attempts", "99999999999"],
        {},
        2,
        # The option's own range, not int4's (which it quoted before).
        "--max-attempts: must be an integer from 1 to 100, got '99999999999'",
    ),
    (
        ["tail", str(uuid.uuid4()), "--from", "9" * 20],
        {},
        2,
        "--from: must be an integer from -9223372036854775808",
    ),
    (
        ["serve", "--insecure-dev"],
        {"DATABASE_URL": "garbage"},
        2,
        "serve: cannot connect to the database (missing",
    ),
    # A URL option libpq cannot parse: --replica-url was a PoolTimeout traceback 30 s after the
    # start, and --listen-url a LISTEN connection retrying in the background while nothing said why.
    (
        ["--database-url", "garbage", "status"],
        {},
        2,
        "argument --database-url: must be a PostgreSQL URL (postgresql://user@host/db) or conninfo string",
    ),
    (
        ["serve", "--insecure-dev", "--replica-url", "garbage"],
        {},
        2,
        "argument --replica-url: must be a PostgreSQL URL",
    ),
    (
        ["serve", "--insecure-dev", "--listen-url", "http://x"],
        {},
        2,
        "argument --listen-url: must be a PostgreSQL URL",
    ),
    (["worker", "--listen-url", "postgresql://u@h/d?nope=1"], {}, 2, 'invalid URI query parameter: "nope"'),
    (
        ["serve", "--host", "no.such.host.invalid"],
        {"RUNROW_TOKENS": "t-0123456789abcdef=u"},
        2,
        "serve: --host no.such",
    ),
    (
        ["worker", "--tools", "no_such_tools_module"],
        {},
        2,
        "worker: --tools 'no_such_tools_module': cannot import",
    ),
    # The agent read it at its first model call: a ValueError there failed every run, one by one.
    (
        ["worker"],
        {"RUNROW_MAX_RETRIES": "two"},
        2,
        "worker: RUNROW_MAX_RETRIES must be a whole number from 0",
    ),
    (
        ["replay", str(uuid.uuid4())],
        {"RUNROW_MAX_RETRIES": "-1"},
        2,
        "RUNROW_MAX_RETRIES must be a whole number",
    ),
    # From a fuzz of every command (a helper): each was a traceback, or started and did nothing.
    (["worker", "--tools", "..x"], {}, 2, "give its absolute dotted path"),
    (["worker", "--handler", "..x:y"], {}, 2, "give the module's absolute dotted path"),
    (["worker", "--worker-id", "w" * 201], {}, 2, "argument --worker-id: must be 1 to 200 characters"),
    (["worker"], {"RUNROW_LOG_FORMAT": "xml"}, 2, "got 'xml' (from $RUNROW_LOG_FORMAT)"),
    (["serve", "--insecure-dev"], {"RUNROW_LOG_FORMAT": "xml"}, 2, "got 'xml' (from $RUNROW_LOG_FORMAT)"),
    (["serve", "--log-format", "yaml"], {}, 2, "argument --log-format: must be one of text, json"),
    (["serve", "--insecure-dev"], {"RUNROW_REPLICA_URL": "x=y"}, 2, '"x" (from $RUNROW_REPLICA_URL)'),
    (["worker"], {"RUNROW_LOG_LEVEL": "loud"}, 2, "got 'loud' (from $RUNROW_LOG_LEVEL)"),
    (["enqueue", "hi", "--metadata", '{"a": NaN}'], {}, 2, "argument --metadata: not JSON this command"),
    (["enqueue", "hi", "--metadata", '{"a": 1e999}'], {}, 2, "holds a number too large for JSON"),
    (["enqueue", "hi", "--metadata", '{"a": "\\u0000"}'], {}, 2, "holds a NUL character"),
    (["serve", "--insecure-dev", "--system-file", "/nonexistent"], {}, 2, "cannot read --system-file"),
    (["migrate"], {"DATABASE_URL": "garbage"}, 2, "runrow migrate: cannot use the database: missing"),
    (["db", "run", "--", "/nonexistent/cmd"], {}, 127, "runrow db run: /nonexistent/cmd: command not found"),
    (["serve", "--port", "99999"], {}, 2, "argument --port: must be a port number from 0 to 65535"),
    # --metrics-host: a name that does not resolve failed after connecting, without naming the
    # option; an empty one bound every interface; alone, it was ignored.
    (
        ["worker", "--metrics-port", "0", "--metrics-host", "no.such.host.invalid"],
        {},
        2,
        "worker: --metrics-host no.such.host.invalid: ",
    ),
    (
        ["worker", "--metrics-port", "0", "--metrics-host", ""],
        {},
        2,
        "argument --metrics-host: must be a host",
    ),
    (["worker", "--metrics-host", "0.0.0.0"], {}, 2, "worker: --metrics-host needs --metrics-port"),
    # 0 reached enqueue_run, whose error quoted an interval; inf made the fake never answer.
    (["enqueue", "hi", "--start-in", "0"], {}, 2, "argument --start-in: must be a number from 0.001"),
    (["fake-model", "--delta-delay", "inf"], {}, 2, "argument --delta-delay: must be a number from 0 to 60"),
    (["demo", "--timeout", "-1"], {}, 2, "argument --timeout: must be a number from 1 to 86400 seconds"),
    (["demo", "--kill-after-step", "-2"], {}, 2, "argument --kill-after-step: must be an integer from 0"),
    (["serve", "--pool-size", "0"], {}, 2, "argument --pool-size: must be an integer from 1 to 1000"),
    (["serve", "--keepalive", "-1"], {}, 2, "argument --keepalive: must be a number from 0.1 to 3600"),
    (["serve", "--max-body", "-1"], {}, 2, "argument --max-body: must be an integer from 1024"),
    (["fake-model", "--port", "99999"], {}, 2, "argument --port: must be a port number from 0 to 65535"),
    # '' bound 0.0.0.0 and :: on two different ports and printed "http://:PORT".
    (["fake-model", "--host", ""], {}, 2, "argument --host: must be a host name or address"),
    (["serve", "--insecure-dev", "--host", ""], {}, 2, "argument --host: must be a host name"),
    # Their own ranges, not int4's, which they quoted (or the database's message, later).
    (
        ["enqueue", "hi", "--priority", "99999999999"],
        {},
        2,
        "argument --priority: must be an integer from -1000",
    ),
    (
        ["schedules", "add", "x", "@daily", "hi", "--priority", "1001"],
        {},
        2,
        "argument --priority: must be an",
    ),
    (
        ["concurrency", "set", "k", "100001"],
        {},
        2,
        "argument max_running: must be an integer from 0 to 100000",
    ),
]


@pytest.mark.parametrize(
    ("args", "env", "code", "expected"),
    REFUSED_BEFORE_ANY_WORK,
    ids=[str(i) for i in range(len(REFUSED_BEFORE_ANY_WORK))],
)
def test_what_cannot_work_is_refused_naming_the_option_without_a_traceback(
    args: list[str | bytes], env: dict[str, str], code: int, expected: str
) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RUNROW_LOG_LEVEL")}
    result = subprocess.run(
        [sys.executable, "-m", "pyworker", *args],
        capture_output=True,
        env={**environ, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", **env},
        timeout=30,
    )
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == code, stderr
    assert "Traceback" not in stderr
    assert expected in stderr.strip().splitlines()[-1], stderr


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ('{"a": ' + "x" * 50_000 + "}", 'not JSON (Expecting value at character 6): \'{"a": xxx'),
        ('{"a": ' + "1" * 5000 + "}", "not JSON this command can read (a number of more than 4300 digits)"),
    ],
    ids=["50 KB of bad JSON", "5000 digits"],
)
def test_bad_metadata_json_is_one_short_line_in_the_users_terms(metadata: str, expected: str) -> None:
    """A bad --metadata was echoed in full (a 50,118-byte error line), and a 5000-digit number
    was refused with Python's advice to "use sys.set_int_max_str_digits()"."""
    result = runrow("postgresql://nobody@127.0.0.1:1/none", "enqueue", "hi", "--metadata", metadata)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert expected in last
    assert len(last) < 200 and "sys." not in last, last


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ("Zq8garbage", "RUNROW_TOKENS: item 1 of 1 has no '=user'"),
        ("0123456789abcdef0=alice,Zq8garbage", "RUNROW_TOKENS: item 2 of 2 has no '=user'"),
    ],
)
def test_a_bad_runrow_tokens_item_is_named_by_position_never_by_its_characters(
    tokens: str, expected: str
) -> None:
    """`RUNROW_TOKENS=garbage` was refused as "garb... has no '=user'": four characters of what
    may be a secret token, in a log. The item is named by its position."""
    result = subprocess.run(
        [sys.executable, "-m", "pyworker", "serve", "--port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "RUNROW_TOKENS": tokens, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"},
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Zq8" not in result.stderr


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            ["serve", "--port", "0", "--insecure-dev"],
            {"RUNROW_TOKENS": ",,"},
            "RUNROW_TOKENS is set but holds no token",
        ),
        (["serve", "--port", "0"], {"RUNROW_TOKENS": " , "}, "RUNROW_TOKENS is set but holds no token"),
        (["serve", "--port", "0", "--tokens-file", "{empty}"], {}, "holds no token"),
    ],
)
def test_a_token_setting_with_no_token_is_refused_at_start(
    tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    """`RUNROW_TOKENS=",,"` (only empty items) was read as no tokens, as if unset: with
    --insecure-dev the service went on without auth, and without it the error said no users were
    configured, not that the variable held none."""
    empty = tmp_path / "tokens.json"
    empty.write_text("{}")
    result = subprocess.run(
        [sys.executable, "-m", "pyworker", *(a.replace("{empty}", str(empty)) for a in args)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RUNROW_TOKENS"}
        | {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", **env},
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr.strip().splitlines()[-1], result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--port", "0", "--insecure-dev", "--listen-url", ""],
        ["serve", "--port", "0", "--insecure-dev", "--replica-url="],
        ["worker", "--listen-url", " "],
    ],
)
def test_an_empty_listen_or_replica_url_is_refused(args: list[str]) -> None:
    """`--listen-url "$DIRECT_URL"` with the variable unset fell back to the database URL (a
    pooler's: LISTEN hears nothing through it) and `--replica-url ""` to the primary, without a
    word; `--database-url ""` was already refused."""
    result = runrow("postgresql://nobody@127.0.0.1:1/none", *args)
    assert result.returncode == 2, result.stderr
    option = args[-1].split("=")[0] if args[-1].startswith("--") else args[-2]
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"argument {option}: is empty (an unset shell variable?): give a URL or leave the option out"
        )
    ), result.stderr


@pytest.mark.parametrize("given", [{}, {"ANTHROPIC_API_KEY": ""}, {"ANTHROPIC_AUTH_TOKEN": "t"}])
def test_replay_refuses_to_start_without_a_model_to_call(given: dict[str, str]) -> None:
    """`runrow worker` refuses to start without ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL (a3a4542);
    `runrow replay` read the run from the database, then called api.anthropic.com without a key
    and failed at the first turn. It is refused the same way before any work: the database here
    cannot be reached, and the refusal is not about it."""
    result = subprocess.run(
        [sys.executable, "-m", "pyworker", "replay", str(uuid.uuid4())],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        | {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", **given},
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert line.startswith(
        "runrow: replay calls the Anthropic Messages API, and neither ANTHROPIC_API_KEY nor "
    ), line
    assert "\n" not in line and "connect" not in line
    assert ("ANTHROPIC_AUTH_TOKEN is set" in line) == bool(given.get("ANTHROPIC_AUTH_TOKEN")), line


def test_serve_says_at_once_that_it_waits_for_an_unreachable_database(tmp_path: Path) -> None:
    """`runrow serve` waited 30 s in silence for a database it could not reach before its
    one-line error. It says so after the first failed attempt, without the password."""
    err = tmp_path / "serve.err"
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyworker", "serve", "--port", "0"],
            env={
                **os.environ,
                "DATABASE_URL": "postgresql://nobody:Pw9secret@127.0.0.1:1/none",
                "RUNROW_TOKENS": "0123456789abcdef0=alice",
            },
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        deadline = time.monotonic() + 20  # well before the 30 s after which it gives up
        while "waiting for the database" not in err.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, f"nothing said in 20 s: {err.read_text()!r}"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(20)
    said = err.read_text()
    assert "waiting for the database at 127.0.0.1:1/none (" in said and "up to 30 s" in said, said
    assert "Connection refused" in said and "Pw9secret" not in said, said


def test_serve_checks_its_standby_at_start_and_no_url_error_repeats_a_password(
    private_database_url: str,
) -> None:
    """An unusable --replica-url was a PoolTimeout traceback 30 s after the start; now it is one
    line before uvicorn starts. A URL that does not parse is refused without repeating it."""
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    no_schema = make_conninfo(private_database_url, dbname="postgres")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyworker",
            "serve",
            "--insecure-dev",
            "--port",
            "0",
            "--replica-url",
            no_schema,
        ],
        capture_output=True,
        text=True,
        env={**environ, "DATABASE_URL": private_database_url},
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "runrow serve: the hot standby has no runrow schema: run `runrow migrate` on its primary"
    )
    leaked = subprocess.run(
        [sys.executable, "-m", "pyworker", "worker", "--listen-url", "postgresql://u:s3cret@[h/x"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=30,
    )
    assert leaked.returncode == 2 and "argument --listen-url" in leaked.stderr, leaked.stderr
    assert "s3cret" not in leaked.stderr


def test_no_login_name_breaks_no_command_but_a_decision_without_by(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container run as an arbitrary uid has no login name: getuser() raised KeyError while the
    parser was built, so every command, --help included, was a traceback."""
    import getpass

    from pyworker.cli.approvals import _default_person
    from pyworker.cli.client import CliError

    def no_login() -> str:
        raise KeyError("getpwuid(): uid not found: 54321")

    monkeypatch.setattr(getpass, "getuser", no_login)
    monkeypatch.delenv("RUNROW_PERSON", raising=False)
    build_parser().parse_args(["approve", "k" * 64])
    with pytest.raises(CliError, match="pass --by NAME or set RUNROW_PERSON"):
        _default_person()
    monkeypatch.setenv("RUNROW_PERSON", "alice")
    assert _default_person() == "alice"


def test_closed_stdin_closed_stdout_and_a_full_disk_are_one_line(
    private_database_url: str,
    conn: psycopg.Connection,  # its teardown cancels the run `enqueue hi > /dev/full` leaves queued
) -> None:
    runrow = f"{sys.executable} -m pyworker --database-url '{private_database_url}'"
    cases = [
        # (shell, exit code of runrow, what stderr says)
        (f"{runrow} enqueue - <&-", 2, "no stdin to read the message from"),
        (f"{runrow} status | head -c0", 1, ""),  # the reader went away: nothing to say
        (f"{runrow} enqueue hi > /dev/full", 1, "cannot write its output (No space left on device)"),
        # argparse ignored the error: exit 0, having written nothing.
        (f"{runrow} --help > /dev/full", 1, "runrow --help: cannot write its output"),
        (f"{runrow} enqueue --help > /dev/full", 1, "runrow enqueue: cannot write its output"),
    ]
    for shell, code, says in cases:
        done = subprocess.run(
            ["bash", "-c", f"{shell}; exit ${{PIPESTATUS[0]}}"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, (shell, done.stderr)
        assert done.returncode == code, (shell, done.returncode, done.stderr)
        assert says in done.stderr, (shell, done.stderr)


def test_enqueue_says_the_new_runs_id_on_stderr_when_stdout_cannot_take_it(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    """`runrow enqueue hi > /dev/full` enqueued a run whose id went nowhere: a retry enqueued
    another. The id is said on stderr, with the error, exit 1."""
    runrow = f"{sys.executable} -m pyworker --database-url '{private_database_url}'"
    done = subprocess.run(
        ["bash", "-c", f"{runrow} enqueue hi > /dev/full"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    said = re.search(
        r"cannot write its output \(No space left on device\); run (\S+) is enqueued", done.stderr
    )
    assert said is not None, done.stderr
    row = conn.execute("SELECT status FROM runrow.agent_run WHERE id = %s", (said[1],)).fetchone()
    assert row == ("queued",)


def test_ctrl_c_on_enqueue_follow_says_the_run_goes_on_and_how_to_rejoin_or_stop_it(
    private_database_url: str,
    conn: psycopg.Connection,  # its teardown cancels the run left queued
    tmp_path: Path,
) -> None:
    """Ctrl-C on `runrow enqueue --follow` exited 130 without a word, as if the run had stopped
    with it. It says the run goes on, and the commands that follow it again or stop it."""
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pyworker",
                "--database-url",
                private_database_url,
                "enqueue",
                "hi",
                "--follow",
            ],
            stdout=stdout,
            stderr=stderr,
            cwd=REPO,
            # A background job (`make test &`, CI's runner) inherits SIGINT ignored, and Python
            # keeps it ignored: the Ctrl-C this test sends would never arrive.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 30
        while not out.read_text().strip():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        run_id = out.read_text().split()[0]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130, err.read_text()
    finally:
        proc.kill()
        proc.wait(20)
    said = err.read_text()
    assert "Traceback" not in said, said
    assert f"run {run_id} goes on" in said, said
    # N: the last seq shown (0 if the signal came before the tail showed any event).
    rejoin = re.search(rf"`runrow tail {run_id} --from (\d+)`", said)
    assert rejoin is not None and f"`runrow cancel {run_id}`" in said, said
    shown = [int(line.split()[1]) for line in said.splitlines() if line.startswith("· ")]
    assert int(rejoin[1]) == (shown[-1] if shown else 0), said


def test_an_unmigrated_database_is_named_and_worker_and_serve_do_not_start(database_url: str) -> None:
    """Against a database without the schema, worker and serve started anyway (the worker failed
    every reap and claim forever, serve answered 500); the client commands said 3F000 only."""
    with temporary_database(database_url, "runrow_cli_empty", migrated=False) as empty:
        for args, says in [
            (["worker", "--handler", "pyworker.worker.echo:handle"], "run `runrow migrate` on it first"),
            (["serve", "--insecure-dev", "--port", "0"], "run `runrow migrate` on it first"),
            (["cancel", str(uuid.uuid4())], "is runrow installed here? run `runrow migrate`"),
        ]:
            done = subprocess.run(
                [sys.executable, "-m", "pyworker", "--database-url", empty, *args],
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert done.returncode == 2, (args, done.stderr[-2000:])
            assert says in done.stderr and "Traceback" not in done.stderr, (args, done.stderr[-2000:])


@pytest.mark.parametrize("state", ["", "{}", "[1]", "folder"])
def test_a_broken_db_state_file_is_named(tmp_path: Path, state: str) -> None:
    """`.runrow/db.json` cut short, emptied or edited was a JSONDecodeError or TypeError traceback
    from every command run in that folder without DATABASE_URL."""
    folder = tmp_path / ".runrow"
    folder.mkdir()
    if state == "folder":
        (folder / "db.json").mkdir()
    else:
        (folder / "db.json").write_text(state)
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "pyworker", "status"],
        cwd=tmp_path,
        env={**environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "does not describe a throwaway cluster" in done.stderr and "db.json" in done.stderr


def test_unreachable_database_says_what_to_do() -> None:
    result = runrow("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", "tail", str(uuid.uuid4()))
    assert result.returncode == 2
    assert result.stderr.startswith("runrow: cannot connect to 127.0.0.1:1/none:")
    assert "DATABASE_URL" in result.stderr and "runrow db start" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--database-url", "", "migrate"],
        ["--database-url=", "status"],
        ["status", "--database-url", "  "],
        ["migrate", "--database-url="],
    ],
)
def test_an_empty_database_url_is_refused_never_replaced_by_another_database(
    private_database_url: str, args: list[str]
) -> None:
    """`runrow --database-url "$PROD_URL" migrate` with PROD_URL unset migrated the database that
    DATABASE_URL (or .runrow/db.json) named, exit 0: a blank option counted as not given."""
    result = runrow(private_database_url, *args)
    assert (result.returncode, result.stdout) == (2, ""), (result.returncode, result.stdout, result.stderr)
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "argument --database-url: is empty (an unset shell variable?): give a URL or leave the option out"
        )
    ), result.stderr


def test_a_blank_database_url_in_the_code_is_an_error_and_a_blank_variable_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same rule where a command hands database_url() a blank value itself. DATABASE_URL set
    to white space counts as unset, as an empty one does: it was a conninfo of nothing, which
    libpq reads as its local default server."""
    from pyworker.db import config, devdb

    monkeypatch.setenv("DATABASE_URL", "postgresql://env@h/db")
    with pytest.raises(config.ConfigError, match="--database-url is empty"):
        config.database_url(" ")
    assert config.database_url(None) == "postgresql://env@h/db"
    monkeypatch.setattr(devdb, "load_state", lambda: None)
    for blank in ("", "  "):
        monkeypatch.setenv("DATABASE_URL", blank)
        with pytest.raises(config.ConfigError, match="no database: set DATABASE_URL"):
            config.database_url()


def test_global_options_work_after_the_command_too(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    """`runrow status --database-url URL` read the URL as a run id, `runrow enqueue hi
    --database-url URL` refused it as an unrecognized argument: global options worked only
    before the command."""
    status = runrow(None, "status", "--database-url", private_database_url, "--log-level", "debug")
    assert status.returncode == 0, status.stderr
    enqueued = runrow(None, "enqueue", "hi", "--database-url", private_database_url)
    assert enqueued.returncode == 0, enqueued.stderr
    run_id = uuid.UUID(enqueued.stdout.strip())
    assert conn.execute("SELECT status FROM runrow.get_run(run_id => %s)", (run_id,)).fetchone() == (
        "queued",
    )
    # An action's own options and the global ones, in any order; the last --database-url wins.
    shown = runrow(
        None,
        "--database-url",
        "postgresql://u@127.0.0.1:1/x",
        "limits",
        "show",
        "--database-url",
        private_database_url,
    )
    assert shown.returncode == 0, shown.stderr
    # A value given before the command is not reset by the command's copy of the option.
    parser = build_parser()
    assert parser.parse_args(["--log-level", "ERROR", "status"]).log_level == "ERROR"
    assert parser.parse_args(["status", "--log-level", "ERROR"]).log_level == "ERROR"
    assert parser.parse_args(["db", "run", "--", "x", "--log-level", "y"]).command == [
        "--",
        "x",
        "--log-level",
        "y",
    ]


def test_db_run_takes_database_url_and_the_other_db_actions_refuse_it(tmp_path: Path) -> None:
    """Every command takes --database-url now: `db run --database-url URL -- CMD` runs CMD on that
    server (as with DATABASE_URL), where a throwaway cluster was started and the URL ignored;
    start, stop and url manage the local cluster only, and say so rather than ignore it. In an
    empty folder: were the option ignored, `db start` would start a cluster there."""
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"PYTHONPATH": str(REPO)}

    def db(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pyworker", "db", *args],
            capture_output=True,
            text=True,
            env=environ,
            cwd=tmp_path,
            timeout=120,
        )

    url = "postgresql://u@127.0.0.1:1/given"
    done = db("run", "--database-url", url, "--", "sh", "-c", 'echo "$DATABASE_URL"')
    assert (done.returncode, done.stdout) == (0, url + "\n"), done.stderr
    for action in ("start", "url", "stop"):
        refused = db(action, "--database-url", url)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith(f"runrow db {action}: --database-url does not apply"), refused.stderr
    assert not (tmp_path / ".runrow").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["status", "postgresql://u:SECRETPW@h/db"], "invalid UUID value: 'postgresql://u:***@h/db'"),
        (
            ["enqueue", "hi", "postgresql://u:SECRETPW@h/db"],
            "unrecognized arguments: postgresql://u:***@h/db",
        ),
        (["postgresql://u:SECRETPW@h/db"], "invalid choice: 'postgresql://u:***@h/db'"),
        (["tail", "host=h password=SECRETPW"], "invalid UUID value: 'host=h password=***'"),
        (["enqueue", "hi", "--model", "m", "password='SECRET PW'"], "unrecognized arguments: password=***"),
        (["cancel", "--database-url", "postgresql://u:SECRETPW@[h/x"], "argument --database-url: must be a"),
    ],
)
def test_no_usage_error_repeats_a_password(args: list[str], says: str) -> None:
    """A URL typed where the command did not take it (the password echoed into scrollback and
    CI logs), whatever the error: each value a usage error quotes is shown without it."""
    result = runrow(None, *args)
    assert result.returncode == 2, result.stderr
    assert "SECRET" not in result.stderr + result.stdout, result.stderr
    assert says in result.stderr.strip().splitlines()[-1], result.stderr


@pytest.mark.parametrize("cmd", ["status", "migrate", "worker"])
@pytest.mark.parametrize("how", ["env", "flag"])
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:SEC%zzRETPW@127.0.0.1:1/x",
        "postgresql://u:SECRETPW@[::1/x",
        "host=a password=SEC RETPW",
    ],
)
def test_a_url_that_does_not_parse_is_never_printed(url: str, how: str, cmd: str) -> None:
    """libpq's parse errors quote the token they could not read, or the whole URL: a password
    with a % pasted into a URL printed it (the review of stop 56)."""
    # The worker gets as far as the database: an agent worker without a model would stop first.
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"ANTHROPIC_API_KEY": "test-key"}
    args = [sys.executable, "-m", "pyworker"]
    if how == "flag":
        args += ["--database-url", url]
    else:
        environ["DATABASE_URL"] = url
    done = subprocess.run(
        [*args, cmd], env={**environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "RETPW" not in done.stderr + done.stdout, done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "host=127.0.0.1 port=1 user=u password=SECRETPW dbname=x connect_timeout=2",
        "postgresql://u@127.0.0.1:1/x?password=SECRETPW&connect_timeout=2",
        "postgresql://u:SECRETPW@127.0.0.1:1/x?connect_timeout=2",
    ],
)
def test_an_unreachable_database_is_named_without_its_password(url: str) -> None:
    """The CLI's message went to scrollback, CI logs and cron mail with the password of a
    conninfo string or of a URL's ?password= in clear (the operator audit); only user:pw@ was
    masked. It names host:port/dbname, as the worker's and serve's log lines do."""
    result = runrow(url, "status")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "SECRETPW" not in result.stderr + result.stdout, result.stderr
    assert result.stderr.startswith("runrow: cannot connect to 127.0.0.1:1/x:"), result.stderr


def test_status_prints_queue_health_fleet_limits_and_webhook_health(
    private_database_url: str, conn: psycopg.Connection
) -> None:
    enqueue(conn)
    result = runrow(private_database_url, "status")
    assert result.returncode == 0, result.stderr
    columns = [c.name for c in conn.execute("SELECT * FROM runrow.queue_health LIMIT 0").description or ()]
    hooks = [c.name for c in conn.execute("SELECT * FROM runrow.webhook_health LIMIT 0").description or ()]
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert names == [
        *columns,
        "rate_limit_keys_blocked",
        "runs_in_backoff",
        "tenants_over_budget",
        *[f"webhooks_{n}" for n in hooks if n != "measured_at"],
    ]
    queued = next(line for line in result.stdout.splitlines() if line.startswith("queued "))
    assert int(queued.split()[1]) >= 1


def test_status_of_a_run_prints_its_token_totals(private_database_url: str, conn: psycopg.Connection) -> None:
    run_id = enqueue(conn)
    token = claim(conn, run_id)
    usages = [
        {
            "input_tokens": 3,
            "output_tokens": 5,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 3000,
        },
        {
            "input_tokens": 1,
            "output_tokens": 7,
            "cache_read_input_tokens": 3000,
            "cache_creation_input_tokens": 40,
        },
    ]
    for i, usage in enumerate(usages):
        conn.execute(
            "SELECT runrow.append_step(run_id => %s, claim_token => %s, kind => 'model_turn', payload => %s, "
            "request_id => %s, usage => %s, stop_reason => 'pause_turn')",
            (run_id, token, json.dumps([{"type": "text", "text": f"part {i}"}]), f"req_{i}", Jsonb(usage)),
        )
    result = runrow(private_database_url, "status", str(run_id))
    assert result.returncode == 0, result.stderr
    table = dict(line.split(maxsplit=1) for line in result.stdout.splitlines() if len(line.split()) == 2)
    assert table["run"] == str(run_id) and table["status"] == "running"
    assert (table["model_turns"], table["input_tokens"], table["output_tokens"]) == ("2", "4", "12")
    assert (table["cache_read_input_tokens"], table["cache_creation_input_tokens"]) == ("3000", "3040")
    unknown = runrow(private_database_url, "status", "00000000-0000-0000-0000-000000000000")
    assert unknown.returncode == 2 and "does not exist" in unknown.stderr and not unknown.stdout
    bad = runrow(private_database_url, "status", "not-a-uuid")
    assert bad.returncode == 2 and "invalid UUID value" in bad.stderr


def test_audit_exit_code_follows_the_violations(database_url: str) -> None:
    # A database of its own: the module's shared one holds runs the other tests left running,
    # whose leases lapse (a violation) when the box is slow.
    with (
        temporary_database(database_url, "runrow_audit") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        result = runrow(url, "audit")
        assert (result.returncode, result.stdout) == (0, ""), result.stderr
        # A disabled schema guard is a violation the audit reports; re-enabled, it is healthy again.
        conn.execute("ALTER TABLE runrow.prompt DISABLE TRIGGER prompt_immutable")
        try:
            result = runrow(url, "audit")
        finally:
            conn.execute("ALTER TABLE runrow.prompt ENABLE TRIGGER prompt_immutable")
        assert result.returncode == 1
        assert result.stdout.splitlines()[0].split() == ["invariant", "run_id", "detail"]
        assert "schema_guard_missing" in result.stdout and "prompt_immutable" in result.stdout
        assert runrow(url, "audit").returncode == 0


@pytest.mark.parametrize(
    ("tokens", "says"),
    [
        (
            "aaaaaaaaaaaaaaaa=alice,aaaaaaaaaaaaaaaa=bob",
            "RUNROW_TOKENS: item 2 of 2 repeats the token of item 1",
        ),
        (
            "aaaaaaaaaaaaaaaa=al\u202eice",
            "a user id holds a control or bidirectional formatting character (U+202E",
        ),
    ],
)
def test_a_repeated_token_or_a_hidden_character_in_a_user_is_refused_at_start(tokens: str, says: str) -> None:
    """A token given twice authenticated as the last user named (the first user's requests became
    the second's); a user id with a bidi override passed, and every enqueue of it was a 400."""
    result = subprocess.run(
        [sys.executable, "-m", "pyworker", "serve", "--port", "0"],
        env={**os.environ, "RUNROW_TOKENS": tokens, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    assert says in result.stderr and "aaaaaaaaaaaaaaaa" not in result.stderr, result.stderr


def test_a_base64_token_keeps_its_padding_and_its_user(tmp_path: Path) -> None:
    """`openssl rand -base64` ends in '=': split at the first '=', the token lost its padding and
    its user became "=alice", another tenant who could not see alice's conversations."""
    from pyworker.http.auth import TokenConfigError, load_tokens_file, parse_tokens_env

    assert parse_tokens_env("q1w2e3r4t5y6u7i8o9p0aA==alice") == {"q1w2e3r4t5y6u7i8o9p0aA=": "alice"}
    # A user id with '=' in it stays whole (split at the last '=', it became another token).
    assert parse_tokens_env("tok_aaaaaaaaaaaaaaaa=team=ops") == {"tok_aaaaaaaaaaaaaaaa": "team=ops"}
    twice = tmp_path / "tokens.json"
    twice.write_text('{"aaaaaaaaaaaaaaaa": "alice", "aaaaaaaaaaaaaaaa": "bob"}')
    with pytest.raises(TokenConfigError, match="entry 2 repeats a token"):
        load_tokens_file(twice)
