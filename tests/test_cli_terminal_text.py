"""Text a model, an API or a person wrote, as the client commands write it to a terminal: its
control characters shown as \\xNN, not obeyed (model output must not retitle the terminal), as
`runrow tail` and `runrow approvals` already did; piped, written as it is. Real processes on
pseudo-terminals (terminal_support), against a private database."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tail_support import claim, enqueue, finish, private_database_url
from terminal_support import HOSTILE, SHOWN, runrow_on_a_terminal
from test_cli import runrow

from pyworker.fake.server import FakeModel

__all__ = ["private_database_url"]

RAW = ("\x1b", "\x07")  # ESC, BEL: what a terminal obeys


def raw_in(text: str) -> bool:
    return any(c in text for c in RAW)


@pytest.fixture
def db(private_database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(private_database_url, autocommit=True) as conn:
        yield conn


def test_a_runs_error_in_status_is_shown_on_a_terminal_and_kept_piped(
    private_database_url: str, db: psycopg.Connection
) -> None:
    """The table printer, the one place every table cell goes through (status, audit, the `show`
    actions, schedules): `runrow status RUN` wrote a run's error raw."""
    run = enqueue(db)
    finish(db, run, claim(db, run), "failed", error=f"model said {HOSTILE}")
    shown = runrow_on_a_terminal(private_database_url, "status", str(run))
    assert shown.returncode == 0, shown.stderr
    assert not raw_in(shown.stdout), repr(shown.stdout)
    assert f"model said {SHOWN}" in shown.stdout
    piped = runrow(private_database_url, "status", str(run))
    assert piped.returncode == 0 and f"model said {HOSTILE}" in piped.stdout  # a program gets it as it is


def test_a_newline_tab_or_bidi_control_in_a_cell_cannot_break_or_redraw_its_row(
    private_database_url: str, db: psycopg.Connection
) -> None:
    """shown() keeps newline and tab (prose needs them) and let bidi controls through; in a table
    cell a newline in a run's error started a line of its own under the table, a tab shifted the
    columns after it, and U+202E drew the rest of the row right to left. Only `approvals` showed
    bidi controls. Every cell now goes through terminal_text.cell() on a terminal."""
    run = enqueue(db)
    error = "line one\nfield\tvalue \u202eevil\u200b"
    finish(db, run, claim(db, run), "failed", error=error)
    shown = runrow_on_a_terminal(private_database_url, "status", str(run))
    assert shown.returncode == 0, shown.stderr
    rows = shown.stdout.splitlines()
    assert [ln.split()[0] for ln in rows] == [
        "run", "status", "model", "attempt", "error", "model_turns", "input_tokens", "output_tokens",
        "cache_read_input_tokens", "cache_creation_input_tokens",
    ], rows  # fmt: skip
    line = next(ln for ln in rows if ln.startswith("error "))
    assert line.split(None, 1)[1] == "line one\\nfield\\tvalue \\u202eevil\\u200b", line
    assert not any(c in shown.stdout for c in "\t\u202e\u200b")
    piped = runrow(private_database_url, "status", str(run))
    assert piped.returncode == 0 and error in piped.stdout  # a program gets it as it is


def test_a_key_error_is_shown_and_its_columns_stay_in_line(
    private_database_url: str, db: psycopg.Connection
) -> None:
    """An API's key error (report_key_error) in `limits show` and `status`: the escape sequence
    was written raw, and its bytes, drawn as nothing, widened its column past its header."""
    # A model of its own: the block holds back that key's runs, and the other tests claim theirs.
    run = db.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', "
        "model => 'blocked')",
        (uuid.uuid4(),),
    ).fetchone()[0]
    # A block longer than the test: the default 5 s ran out before `status` read it on a loaded box.
    db.execute(
        "SELECT runrow.report_key_error(run_id => %s, claim_token => %s, error => %s, "
        "first_block_seconds => 300)",
        (run, claim(db, run), f"permission_error: {HOSTILE}"),
    )
    db.execute("SELECT runrow.cancel_run(run_id => %s)", (run,))  # deferred, it would be claimed later
    shown = runrow_on_a_terminal(private_database_url, "limits", "show")
    assert shown.returncode == 0, shown.stderr
    assert not raw_in(shown.stdout), repr(shown.stdout)
    lines = shown.stdout.splitlines()
    header = lines.index(next(ln for ln in lines if ln.startswith("rate_limit_key")))
    names, dashes, row = lines[header : header + 3]
    spans = [m.span() for m in re.finditer("-+", dashes)]
    cells = dict(zip(names.split(), (row[a:b].strip() for a, b in spans), strict=True))
    assert cells["key_error"] == f"permission_error: {SHOWN}"
    assert (
        cells["rate_limit_key"] == "blocked" and cells["key_errors"] == "1"
    )  # the column after it, where its header says
    status = runrow_on_a_terminal(private_database_url, "status")
    assert status.returncode == 0, status.stderr
    assert not raw_in(status.stdout) and f"KEY ERROR x1: permission_error: {SHOWN}" in status.stdout


def test_names_echoed_back_and_error_lines_are_shown(
    private_database_url: str, db: psycopg.Connection
) -> None:
    """The confirmation lines name what was typed; the error lines quote it (on stderr). A name
    with a control character is refused since migration 0085, but one stored before stays and
    is removed by name."""
    tenant = "t\x1b[31mred"
    with db.transaction():  # a row from before the rule; no other session sees the trigger off
        db.execute("ALTER TABLE runrow.tenant_budget DISABLE TRIGGER tenant_budget_key_printable")
        db.execute(
            "INSERT INTO runrow.tenant_budget (fairness_key, tokens_per_day) VALUES (%s, 1000)", (tenant,)
        )
        db.execute("ALTER TABLE runrow.tenant_budget ENABLE TRIGGER tenant_budget_key_printable")
    removed = runrow_on_a_terminal(private_database_url, "budget", "remove-tenant", tenant)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout == "budget of tenant t\\x1b[31mred removed\n"
    refused = runrow_on_a_terminal(private_database_url, "limits", "remove", "k\x1b[2J")
    assert refused.returncode == 2
    assert refused.stderr == 'runrow: not found: rate_limit_key "k\\x1b[2J" has no rate limit to remove\n'


def test_replay_shows_both_answers_control_characters(
    private_database_url: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    """`runrow replay` printed the recorded answer and the new one (the fake echoes the user's
    message, hostile text included) raw, side by side."""
    run = enqueue(db, f"hi {HOSTILE}")
    token = claim(db, run)
    db.execute(
        "SELECT runrow.append_step(run_id => %s, claim_token => %s, kind => 'model_turn', "
        "payload => %s::json)",
        (run, token, json.dumps([{"type": "text", "text": f"recorded {HOSTILE}"}])),
    )
    finish(db, run, token)
    with FakeModel("text") as fake:
        env = {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "test-key"}
        shown = runrow_on_a_terminal(private_database_url, "replay", str(run), "--width", "160", env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert not raw_in(shown.stdout), repr(shown.stdout)
    step = next(ln for ln in shown.stdout.splitlines() if ln.startswith("recorded \\x1b"))
    left, right = step.split(" | ")
    assert left.rstrip() == f"recorded {SHOWN}" and len(left) == (160 - 3) // 2
    assert right == f"Hello from the fake model. You said: hi {SHOWN}"


def test_an_unknown_run_stays_a_plain_error(private_database_url: str) -> None:
    done = runrow_on_a_terminal(private_database_url, "status", str(uuid.UUID(int=7)))
    assert (done.returncode, done.stderr) == (2, f"runrow: run {uuid.UUID(int=7)} does not exist\n")
