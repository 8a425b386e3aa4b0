"""The plans of the statements one call executes, read with auto_explain's nested statements (sent
to the session as NOTICEs). The connection must be a superuser's with auto_explain LOADed.
Counted, never timed."""

from __future__ import annotations

import json

import psycopg


def nested_plans(
    conn: psycopg.Connection,
    sql: str,
    params: tuple[object, ...] = (),
    *,
    settings: tuple[tuple[str, str], ...] = (),
    commit: bool = False,
) -> list[dict]:
    """auto_explain's JSON plan of every statement one call of `sql` executes, in the order they
    end, the call's own last; under `settings` too (each for the transaction), rolled back unless
    `commit`."""
    found: list[dict] = []

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if "plan:" in message:
            found.append(json.loads(message.split("plan:", 1)[1]))

    every = (
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_format", "json"),
        ("auto_explain.log_level", "notice"),
        ("client_min_messages", "notice"),
        *settings,
    )
    conn.add_notice_handler(collect)
    try:
        with conn.transaction(force_rollback=not commit):
            conn.execute(
                "SELECT " + ", ".join("set_config(%s, %s, true)" for _ in every),
                [value for pair in every for value in pair],
            )
            found.clear()  # the settings' own statement
            conn.execute(sql, params).fetchall()
            # The call's own plan is reported when its portal closes, with this statement.
            conn.execute("SELECT set_config('auto_explain.log_min_duration', '-1', true)")
    finally:
        conn.remove_notice_handler(collect)
    return found
