"""Resume against the fake API's signature check (thinking on: every earlier thinking block is
verified against the exact history before it, like the real API).

- The real resume path is accepted: a worker is SIGKILLed mid-run, another rebuilds the request
  from `conversation_history` and the API takes it; the resumed request carries the earlier
  request and response unchanged, and the stored payloads are the SDK's serialization, verbatim.
- One altered byte in the stored history (bypassing the append-only guard, as only a table owner
  can) is refused: 400 invalid signature, and the run fails with that error, not a retry loop.
- The next turn of a conversation sends the earlier turn back as stored and is accepted.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from agent_support import QUICK_TAKEOVER, ForkedWorker, agent_env, enqueue_agent, steps, undecorated
from worker_support import db, run_row, wait_status, wait_until, worker_db

from pyworker.db.keys import tool_call_key
from pyworker.demo import tools as demo_tools
from pyworker.fake.server import FakeModel

__all__ = ["db", "worker_db"]

TERMINAL = {"completed", "failed", "dead"}


@pytest.fixture
def fake() -> FakeModel:
    with FakeModel("demo") as server:
        yield server


def kill_after_step(db: psycopg.Connection, worker: ForkedWorker, run: uuid.UUID, n: int) -> None:
    wait_until(lambda: len(steps(db, run)) >= n, 30, f"step {n}")
    worker.kill()
    assert len(steps(db, run)) == n


def test_resumed_request_is_the_stored_history_unchanged_and_is_accepted(
    db, worker_db, fake, tmp_path
) -> None:
    env = agent_env(fake.base_url, tmp_path, tool_delay="0.3")
    a = ForkedWorker(worker_db, "a", env, **QUICK_TAKEOVER)
    run = enqueue_agent(db)
    kill_after_step(db, a, run, 6)  # step 6 asked for send_email; the kill lands in that tool
    before = list(fake.requests)
    assert len(before) == 3
    b = ForkedWorker(worker_db, "b", env, **QUICK_TAKEOVER)
    try:
        assert wait_status(db, run, TERMINAL, 30) == "completed"
    finally:
        b.kill()
    assert run_row(db, run)["attempt"] == 2
    requests = fake.requests
    assert len(requests) == 6  # no committed model turn was asked for again
    assert all(r.status == 200 and r.outcome == "ok" for r in requests)  # every signature verified
    last_before, first_after = before[-1], requests[3]
    resent = undecorated(first_after.body["messages"])
    n = len(last_before.body["messages"])
    assert resent[:n] == undecorated(last_before.body["messages"])
    assert resent[n] == {"role": "assistant", "content": last_before.response["content"]}
    assert resent[n + 1]["content"][0]["type"] == "tool_result"
    # Each model_turn payload is the SDK's message content serialized once (json.dumps), stored
    # and read back byte for byte.
    for _, kind, text in steps(db, run):
        if kind == "model_turn":
            assert text == json.dumps(json.loads(text), ensure_ascii=False)
            assert json.loads(text)[0]["type"] == "thinking" and json.loads(text)[0]["signature"]


def tamper_first_thinking(db: psycopg.Connection, run: uuid.UUID) -> None:
    """Change one character of step 1's thinking text, as only the table owner can (the guard
    trigger rejects every UPDATE; the owner can switch it off inside a transaction)."""
    with db.transaction():
        db.execute("ALTER TABLE runrow.agent_step DISABLE TRIGGER agent_step_guard")
        cur = db.execute(
            "UPDATE runrow.agent_step SET payload = replace(payload::text, 'Step 0:', 'Step O:')::json "
            "WHERE run_id = %s AND seq = 1",
            (run,),
        )
        assert cur.rowcount == 1
        db.execute("ALTER TABLE runrow.agent_step ENABLE TRIGGER agent_step_guard")


def test_one_altered_byte_in_the_history_is_refused_and_the_run_fails(db, worker_db, fake, tmp_path) -> None:
    env = agent_env(fake.base_url, tmp_path, tool_delay="0.3")
    a = ForkedWorker(worker_db, "a", env, **QUICK_TAKEOVER)
    run = enqueue_agent(db, max_attempts=3)
    kill_after_step(db, a, run, 3)  # mid step 3's tool calls
    original = steps(db, run)[0][2]
    tamper_first_thinking(db, run)
    altered = steps(db, run)[0][2]
    assert len(altered) == len(original) and sum(x != y for x, y in zip(altered, original, strict=True)) == 1
    b = ForkedWorker(worker_db, "b", env, **QUICK_TAKEOVER)
    try:
        assert wait_status(db, run, TERMINAL, 30) == "failed"
    finally:
        b.kill()
    row = run_row(db, run)
    assert row["attempt"] == 2  # not retried: a 400 is final
    assert "HTTP 400" in row["error"] and "Invalid `signature` in `thinking` block" in row["error"], row[
        "error"
    ]
    assert fake.requests[-1].status == 400
    # The resumed attempt finished step 3's tools, then its model call was refused: no new turn.
    assert [kind for _, kind, _ in steps(db, run)] == [
        "model_turn",
        "tool_result",
        "model_turn",
        "tool_result",
        "tool_result",
    ]


def test_the_next_turn_sends_the_earlier_turn_back_as_stored(db, worker_db, fake, tmp_path) -> None:
    env = agent_env(fake.base_url, tmp_path)
    w = ForkedWorker(worker_db, "w", env, **QUICK_TAKEOVER)
    try:
        conversation = uuid.uuid4()
        first = enqueue_agent(db, "First task.", conversation_id=conversation)
        second = enqueue_agent(db, "Again, please.", conversation_id=conversation)
        assert wait_status(db, first, TERMINAL, 30) == "completed"
        assert wait_status(db, second, TERMINAL, 30) == "completed"
    finally:
        w.kill()
    first_last, second_first = fake.requests[5], fake.requests[6]
    history = undecorated(second_first.body["messages"])
    n = len(first_last.body["messages"])
    assert history[:n] == undecorated(first_last.body["messages"])
    assert history[n] == {"role": "assistant", "content": first_last.response["content"]}
    assert history[n + 1] == {"role": "user", "content": "Again, please."}
    assert all(r.status == 200 for r in fake.requests)


def hand_back_after_a_model_turn(
    db: psycopg.Connection,
    run: uuid.UUID,
    content: list[dict],
    stop_reason: str,
    answer: int = 0,
    ending: dict | None = None,
) -> None:
    """Play an earlier attempt through the SQL API: claim, commit a model turn with `ending`'s
    fields on the step (and its model_turn event, as the agent does, in one transaction), answer
    the first `answer` tool calls through begin/complete_tool_call, then hand the run back
    (requeued)."""
    run_id, token = db.execute(
        "SELECT run_id, claim_token FROM runrow.claim_run("
        "worker_id => 'earlier-attempt', lease_seconds => 30)"
    ).fetchone()
    assert run_id == run
    ending = ending or {}
    details = ending.get("stop_details")
    with db.transaction():
        (seq,) = db.execute(
            "SELECT runrow.append_step(run_id => %s, claim_token => %s, kind => 'model_turn', "
            "payload => %s::json, request_id => 'req_earlier', stop_reason => %s, "
            "stop_sequence => %s, stop_details => %s::jsonb)",
            (
                run,
                token,
                json.dumps(content),
                stop_reason,
                ending.get("stop_sequence"),
                None if details is None else json.dumps(details),
            ),
        ).fetchone()
        event = {"type": "model_turn", "step_seq": seq, "stop_reason": stop_reason, **ending}
        db.execute(
            "SELECT runrow.append_events(run_id => %s, claim_token => %s, events => %s::jsonb)",
            (run, token, json.dumps([event])),
        )
    for block in [b for b in content if b["type"] == "tool_use"][:answer]:
        key = tool_call_key(run, seq, block["id"], block["name"], block["input"])
        (state,) = db.execute(
            "SELECT state FROM runrow.begin_tool_call(run_id => %s, claim_token => %s, "
            "idempotency_key => %s, tool => %s, args => %s::jsonb, effect => 'pure')",
            (run, token, key, block["name"], json.dumps(block["input"])),
        ).fetchone()
        assert state == "execute"
        db.execute(
            "SELECT runrow.complete_tool_call(run_id => %s, claim_token => %s, idempotency_key => %s, "
            "result => %s::jsonb)",
            (run, token, key, json.dumps("answered by the earlier attempt")),
        )
    (outcome,) = db.execute(
        "SELECT runrow.release_run(run_id => %s, claim_token => %s, error => 'handed back by the test')",
        (run, token),
    ).fetchone()
    assert outcome == "requeued"


EARLIER_TURN = [
    {"type": "text", "text": "Looking around."},
    {"type": "tool_use", "id": "toolu_earlier_1", "name": "list_files", "input": {"path": "."}},
    {"type": "tool_use", "id": "toolu_earlier_2", "name": "read_file", "input": {"path": "notes/todo.txt"}},
]


def test_resume_runs_only_the_tool_calls_still_missing_a_result(db, worker_db, fake, tmp_path) -> None:
    run = enqueue_agent(db, metadata={}, max_attempts=3)
    hand_back_after_a_model_turn(db, run, EARLIER_TURN, "tool_use", answer=1)
    w = ForkedWorker(worker_db, "resumer", agent_env(fake.base_url, tmp_path), **QUICK_TAKEOVER)
    try:
        assert wait_status(db, run, TERMINAL, 30) == "completed"
    finally:
        w.kill()
    ran = [(e.tool, e.args) for e in demo_tools.records(tmp_path)]
    assert ("list_files", {"path": "."}) not in ran  # answered before: not run again
    assert ("read_file", {"path": "notes/todo.txt"}) in ran
    first = undecorated(fake.requests[0].body["messages"])
    assert first[1] == {"role": "assistant", "content": EARLIER_TURN}  # sent back as stored
    assert [b["tool_use_id"] for b in first[2]["content"]] == ["toolu_earlier_1", "toolu_earlier_2"]
    assert first[2]["content"][0]["content"] == "answered by the earlier attempt"
    assert run_row(db, run)["attempt"] == 2


def test_a_resumed_turn_cut_by_max_tokens_never_runs_its_tool_calls(db, worker_db, fake, tmp_path) -> None:
    run = enqueue_agent(db, metadata={}, max_attempts=3)
    hand_back_after_a_model_turn(db, run, EARLIER_TURN, "max_tokens")
    w = ForkedWorker(worker_db, "resumer", agent_env(fake.base_url, tmp_path), **QUICK_TAKEOVER)
    try:
        assert wait_status(db, run, TERMINAL, 30) == "failed"
    finally:
        w.kill()
    row = run_row(db, run)
    assert row["error"].startswith("max_tokens") and row["result"]["text"] == "Looking around."
    assert demo_tools.records(tmp_path) == []  # no tool ran
    assert fake.requests == []  # and the model was not asked again


@pytest.mark.parametrize(
    ("stop_reason", "ending"),
    [
        ("stop_sequence", {"stop_sequence": "END"}),
        ("refusal", {"stop_details": {"type": "refusal", "category": "cyber", "explanation": "declined"}}),
    ],
)
def test_a_run_resumed_after_its_last_turn_ends_with_what_that_turn_said(
    db, worker_db, fake, tmp_path, stop_reason: str, ending: dict
) -> None:
    # The earlier attempt committed the final turn and died before finishing the run: the
    # resumed one ends it from the stored turn, with the stop_sequence or the refusal's details
    # the first would have put in the result (kept on the turn's step, as the agent keeps them).
    run = enqueue_agent(db, metadata={}, max_attempts=3)
    hand_back_after_a_model_turn(db, run, [{"type": "text", "text": "Done."}], stop_reason, ending=ending)
    w = ForkedWorker(worker_db, "resumer", agent_env(fake.base_url, tmp_path), **QUICK_TAKEOVER)
    try:
        assert wait_status(db, run, TERMINAL, 30) == "completed"
    finally:
        w.kill()
    assert run_row(db, run)["result"] == {"text": "Done.", "stop_reason": stop_reason, **ending}
    assert fake.requests == []  # the model was not asked again
