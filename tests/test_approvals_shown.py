"""`runrow approvals` shows the characters that would redraw a tool call's arguments as escapes:
the person approving an irreversible call reads what the model wrote, not what a bidi override
or a C1 control makes the terminal draw (the web audit found the same on the chat page's card)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from pyworker.cli.approvals import describe
from pyworker.db.steps import PendingApproval


def pending(args: dict[str, object]) -> PendingApproval:
    now = datetime.now(UTC)
    return PendingApproval(
        idempotency_key="k" * 64,
        reason="needs_approval",
        run_id=uuid.uuid4(),
        conversation_id=uuid.uuid4(),
        user_id="alice",
        tool="shell",
        args=args,
        effect="irreversible",
        tool_use_id="tu_1",
        step_seq=1,
        previously_approved=None,
        previously_decided_by=None,
        started_at=None,
        created_at=now,
        waiting_since=now,
    )


def test_bidi_and_invisible_characters_are_shown_as_escapes() -> None:
    line = describe(pending({"cmd": "echo safe \u202e; fr- mr\u202c", "x": "a\u200bb\x9b2J"}))[1]
    assert '"cmd": "echo safe \\u202e; fr- mr\\u202c"' in line
    assert '"x": "a\\u200bb\\u009b2J"' in line
    assert not any(c in line for c in "\u202e\u202c\u200b\x9b")


def test_ordinary_text_is_left_as_written() -> None:
    assert '"city": "Zürich ☀"' in describe(pending({"city": "Zürich ☀"}))[1]
