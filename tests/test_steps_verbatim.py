"""A step payload goes in through append_step and comes out of conversation_history
byte for byte: key order, whitespace, \\u escapes, thinking and redacted_thinking blocks
with their signatures."""

from __future__ import annotations

import json

import psycopg
from race_support import database_url
from steps_support import append_step
from tail_support import claim, enqueue

# What an SDK might have produced: keys in the provider's order (not sorted), odd
# whitespace and a newline between blocks, \u escapes (one a surrogate pair), a literal
# backslash before "u0000" (which is not the NUL escape),
# escaped slashes, a signed thinking block and a redacted_thinking block.
MODEL_TURN = (
    '[ {"type":"thinking","thinking":"Let me think\\u2026 about \\"caf\\u00e9\\" \\ud83d\\ude00",'
    '"signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxW+/fJ3A==\\/sig"},\n'
    '  {"type": "redacted_thinking",   "data": "EmwKAhgBEgy3va3pzix\\/Tz4eFwQaDAX3WuH+wd=="},'
    '{"type":"text","text":"Tab\\there, not NUL \\\\u0000 and a quote \\" end","citations":null},\t'
    '{"id":"toolu_01A","input":{"z":1,"a":{"y":[1.50,2e3,-0]},"\\u00e9":"x"},'
    '"name":"lookup","type":"tool_use"} ]'
)
TOOL_RESULT = (
    '{ "tool_use_id" : "toolu_01A", "type":"tool_result", '
    '"content" : [ {"type":"text","text":"\\u00e9t\\u00e9"} ] }'
)
FINAL_TURN = '[{"type":"text","text":"done"}]   '


__all__ = ["database_url"]  # fixture: this module's own database


def test_payloads_round_trip_byte_for_byte(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = enqueue(conn, "what is in the table?")
        token = claim(conn, run_id)
        assert append_step(conn, run_id, token, "model_turn", MODEL_TURN) == 1
        assert append_step(conn, run_id, token, "tool_result", TOOL_RESULT) == 2
        assert append_step(conn, run_id, token, "model_turn", FINAL_TURN) == 3

        conversation_id = conn.execute(
            "SELECT conversation_id FROM runrow.agent_run WHERE id = %s", (run_id,)
        ).fetchone()[0]
        rows = conn.execute(
            "SELECT source, seq, payload::text FROM runrow.conversation_history(%s, %s)",
            (conversation_id, run_id),
        ).fetchall()

        assert rows == [
            ("user_message", None, '"what is in the table?"'),
            ("step", 1, MODEL_TURN),
            ("step", 2, TOOL_RESULT),
            ("step", 3, FINAL_TURN),
        ]
        # The same bytes, not merely the same characters.
        assert [r[2].encode() for r in rows[1:]] == [
            p.encode() for p in (MODEL_TURN, TOOL_RESULT, FINAL_TURN)
        ]
        # And the signatures survive a parse, for a worker that loads the blocks.
        blocks = json.loads(rows[1][2])
        assert blocks[0]["signature"] == "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxW+/fJ3A==/sig"
        assert blocks[1] == {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/Tz4eFwQaDAX3WuH+wd=="}


def test_jsonb_would_not_have_kept_them(database_url: str) -> None:
    """The test above can fail: a jsonb column would have normalized these payloads."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for payload in (MODEL_TURN, TOOL_RESULT, FINAL_TURN):
            assert conn.execute("SELECT %s::json::jsonb::text", (payload,)).fetchone()[0] != payload


def test_the_nul_escape_is_kept_verbatim_too(database_url: str) -> None:
    """A NUL in the model's text is the escape \\u0000 in the json: stored and read back as is
    (PostgreSQL's JSON operators cannot process it, so nothing on the way may use them on it)."""
    turn = (
        '[{"type":"text","text":"a \\u0000 b, \\\\u0000 is not one"},'
        '{"type":"tool_use","id":"t1","name":"n","input":{"q":"\\u0000"}}]'
    )
    result = '{"type":"tool_result","tool_use_id":"t1","content":"got \\u0000"}'
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = enqueue(conn, "nul")
        token = claim(conn, run_id)
        assert append_step(conn, run_id, token, "model_turn", turn) == 1
        assert append_step(conn, run_id, token, "tool_result", result) == 2
        conversation_id = conn.execute(
            "SELECT conversation_id FROM runrow.agent_run WHERE id = %s", (run_id,)
        ).fetchone()[0]
        rows = conn.execute(
            "SELECT payload::text FROM runrow.conversation_history(%s, %s) WHERE source = 'step'",
            (conversation_id, run_id),
        ).fetchall()
    assert [r[0] for r in rows] == [turn, result]
    assert json.loads(turn)[0]["text"] == "a \x00 b, \\u0000 is not one"
