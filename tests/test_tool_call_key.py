"""runrow.tool_call_key (SQL) and pyworker.db.keys.tool_call_key (Python) agree on tricky args."""

from __future__ import annotations

import json
import uuid

import pytest

from pyworker.db.keys import canonical_json, tool_call_key

RUN = uuid.UUID("0b1e6a4e-5c1f-4d0e-9a55-6f3c2d1e0a99")

TRICKY_ARGS = [
    {},
    {"b": 1, "a": 2, "aa": 3, "B": 4, "_": 5, "": 6},
    {"nested": {"z": [1, {"y": None, "x": True}], "a": {"k": False}}, "list": [[], {}, ""]},
    {"unicode": "héllo wörld ✓ 日本語 🎉", "ключ": "значение", "ä": 1, "z": 2, "é": 3, "😀": 4, "ﬀ": 5},
    {"escapes": 'quote " backslash \\ slash / nl \n cr \r tab \t bs \b ff \f nul-ish \x01 \x1f del \x7f'},
    {"ls": "line\u2028sep\u2029para", "bom": "\ufeff", "astral": "\U0001f600"},
    {"ints": [0, -1, 7, 2**53 + 1, -(2**63), 10**30]},
    {
        "floats": [
            0.1,
            -2.5,
            1.0,
            100.0,
            3.141592653589793,
            1e16,
            1.5e300,
            1e-07,
            2.5e-12,
            -0.0,
            123456789.125,
        ]
    },
    {"mixed": [1, 1.0, "1", True, None, {"1": 1}]},
]


def _sql_key(conn, step_seq: int, tool_use_id: str, tool: str, args: dict) -> str:
    # Sent as the JSON text the worker sends (json.dumps), parsed by PostgreSQL.
    row = conn.execute(
        "SELECT runrow.tool_call_key(%s, %s, %s, %s, %s::jsonb)",
        (RUN, step_seq, tool_use_id, tool, json.dumps(args)),
    ).fetchone()
    return row[0]


@pytest.mark.parametrize("args", TRICKY_ARGS, ids=range(len(TRICKY_ARGS)))
def test_sql_and_python_keys_agree(connect, args: dict) -> None:
    conn = connect()
    assert _sql_key(conn, 7, "toolu_01ABC", "charge_card", args) == tool_call_key(
        RUN, 7, "toolu_01ABC", "charge_card", args
    )


@pytest.mark.parametrize("args", TRICKY_ARGS, ids=range(len(TRICKY_ARGS)))
def test_canonical_text_agrees(connect, args: dict) -> None:
    conn = connect()
    row = conn.execute("SELECT runrow._canonical_json(%s::jsonb)", (json.dumps(args),)).fetchone()
    assert row[0] == canonical_json(args)


def test_canonical_json_is_json_dumps_for_ordinary_values() -> None:
    args = {"b": [1, 2.5, "x"], "a": {"é": None, "d": True}}
    assert canonical_json(args) == json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_every_part_of_the_position_changes_the_key() -> None:
    base = tool_call_key(RUN, 3, "toolu_1", "send_email", {"to": "a@example.com"})
    assert base == tool_call_key(str(RUN).upper(), 3, "toolu_1", "send_email", {"to": "a@example.com"})
    others = {
        tool_call_key(uuid.uuid4(), 3, "toolu_1", "send_email", {"to": "a@example.com"}),
        tool_call_key(RUN, 4, "toolu_1", "send_email", {"to": "a@example.com"}),
        tool_call_key(RUN, 3, "toolu_2", "send_email", {"to": "a@example.com"}),
        tool_call_key(RUN, 3, "toolu_1", "send_sms", {"to": "a@example.com"}),
        tool_call_key(RUN, 3, "toolu_1", "send_email", {"to": "b@example.com"}),
    }
    assert base not in others and len(others) == 5


def test_documented_derivation() -> None:
    # The derivation spelled out, so any language can check itself against it.
    import hashlib

    material = f"{RUN}:7:toolu_01ABC:charge_card:" + '{"amount":1250,"currency":"eur"}'
    expected = hashlib.sha256(material.encode()).hexdigest()
    assert (
        tool_call_key(RUN, 7, "toolu_01ABC", "charge_card", {"currency": "eur", "amount": 1250}) == expected
    )


def test_non_json_values_are_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    with pytest.raises(TypeError):
        canonical_json({1: "x"})
    with pytest.raises(TypeError):
        tool_call_key(RUN, 1, "t", "tool", ["not", "an", "object"])  # type: ignore[arg-type]
