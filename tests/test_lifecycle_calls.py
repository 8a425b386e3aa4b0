"""How many PL/pgSQL functions one lifecycle call runs: the calls it must make, not one more
per run. Each call below is a function call of its own plus the trigger and helper calls it
sets off, and each of those is a statement and a search_path switch of the backend's time.

Counted with track_functions = 'all' from this backend's own counters
(pg_stat_get_xact_function_calls: exact within a transaction, no stats flush to wait for),
never in time. Every call is rolled back, so each count starts from the same tables.

What this pins (migration 0028 and the argument checks of the hot functions):
- agent_run's AFTER UPDATE work (turn order, unblocking an ended run's next turn) runs once per
  UPDATE statement, not once per ended run;
- a claim that finds no delayed run due runs no promotion UPDATE, so no trigger call for it;
- a claim that finds nothing runs no UPDATE at all, and reads no fleet-limit table;
- the argument helpers (_require_*) are called only when an argument is bad;
- heartbeat and finish_run stamp updated_at themselves, so agent_run's guard trigger (whose WHEN
  passes any write that leaves updated_at behind) skips its call for them, as for the batch path;
- the per-row calls are the two rules that need one: the journal guard per journal row, and
  agent_run_state's function per agent_run row written (0045; its CHECK compiled per statement
  is a call's text, not the six rules').
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from lifecycle_support import completed
from race_support import database_url, drain, enqueue, owner, superuser_on

RUNS = 10

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


@pytest.fixture
def counted(database_url: str, cluster_urls: tuple[str, str]) -> Iterator[psycopg.Connection]:
    """A superuser session on this module's database: track_functions is superuser-only. The
    counts are the same for any role: the functions are SECURITY DEFINER."""
    url = superuser_on(database_url, cluster_urls)
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


FUNCTIONS = """
    SELECT p.proname, pg_stat_get_xact_function_calls(p.oid)
    FROM pg_proc AS p WHERE p.pronamespace = 'runrow'::regnamespace
      AND pg_stat_get_xact_function_calls(p.oid) > 0
"""


def calls(conn: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> dict[str, int]:
    """The runrow functions one call of `sql` runs, and how often, rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL track_functions = 'all'")
        before = dict(conn.execute(FUNCTIONS).fetchall())
        conn.execute(sql, params).fetchall()
        after = dict(conn.execute(FUNCTIONS).fetchall())
    return {name: n - before.get(name, 0) for name, n in after.items() if n > before.get(name, 0)}


def test_a_batch_lifecycle_runs_a_fixed_number_of_functions(
    owner: psycopg.Connection, counted: psycopg.Connection
):
    for _ in range(RUNS):
        enqueue(owner, uuid.uuid4())
    worker = counted
    claim = calls(worker, "SELECT * FROM runrow.claim_runs('calls-probe', %s, 30)", (RUNS,))

    runs = worker.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('calls-probe', %s, 30)", (RUNS,)
    ).fetchall()
    assert len(runs) == RUNS
    heartbeat = calls(worker, "SELECT * FROM runrow.heartbeat(%s, %s, 30)", runs[0])
    append = calls(
        worker, "SELECT runrow.append_events(%s, %s, %s::jsonb)", (*runs[0], '[{"type": "text_delta"}]')
    )
    appends = json.dumps(
        [{"run_id": str(r), "claim_token": str(t), "events": [{"type": "text_delta"}]} for r, t in runs]
    )
    append_runs = calls(worker, "SELECT * FROM runrow.append_runs_events(%s::jsonb)", (appends,))
    acks = completed(runs)
    finish = calls(worker, "SELECT * FROM runrow.finish_runs(%s::jsonb)", (acks,))
    one = calls(worker, "SELECT runrow.finish_run(%s, %s, 'completed')", runs[0])
    for _ in range(RUNS):
        enqueue(owner, uuid.uuid4())
    both = calls(
        worker, "SELECT * FROM runrow.finish_and_claim_runs(%s::jsonb, 'calls-probe', %s, 30)", (acks, RUNS)
    )
    print(
        f"claim_runs({RUNS}) {claim}; heartbeat {heartbeat}; append_events {append}; "
        f"finish_runs({RUNS}) {finish}; finish_run {one}; finish_and_claim_runs({RUNS}, {RUNS}) {both}"
    )
    drain(owner)

    # Two calls per row are left, each a rule of the schema: the journal guard (it assigns each
    # journal row its seq) and agent_run_state's function (migration 0045: a call per written
    # row costs less than the six CHECKs' text compiled per statement, up to batch 10 at least).
    # A queue of one keyless group: the walk's fast path, its batch step a function of its own.
    assert claim == {
        "claim_runs": 1,
        "_claim": 1,
        "_claim_walk": 1,
        "_claim_batch_step": 1,
        "_agent_run_after_update": 1,
        "_agent_run_state_valid": RUNS,
        "_run_event_guard": RUNS,
    }
    assert heartbeat == {"heartbeat": 1, "_agent_run_after_update": 1, "_agent_run_state_valid": 1}
    # No tail watches these runs: the wake helper is not called (its DELETE and PERFORM stay
    # off the call); test_a_watched_ending_still_wakes_its_tails has the other case.
    batch_finish = {"_finish_runs_input": 1, "_agent_run_after_update": 1}
    assert finish == {
        "finish_runs": 1,
        **batch_finish,
        "_agent_run_state_valid": RUNS,
        "_run_event_guard": RUNS,
    }
    # Ending a batch and claiming the next: one UPDATE, so agent_run's statement trigger once.
    assert both == {
        "finish_and_claim_runs": 1,
        "_claim_walk": 1,
        "_claim_batch_step": 1,
        **batch_finish,
        "_agent_run_state_valid": 2 * RUNS,
        "_run_event_guard": 2 * RUNS,
    }
    # The single-run functions share their journal helpers with the other writers.
    assert append == {
        "append_events": 1,
        "_hold_claim": 1,
        "_journal": 1,
        "_wake_tails": 1,
        "_run_event_guard": 1,
    }
    # Many runs' appends: the input checked once, every run fenced and journaled by one
    # statement each for the batch (no per-run helper), the tails' wake one statement.
    assert append_runs == {"append_runs_events": 1, "_append_runs_input": 1, "_run_event_guard": RUNS}
    # No tail watches it: the wake and its DELETE of the run's watches are skipped, as in
    # finish_runs (test_a_watched_ending_still_wakes_its_tails has the other case).
    assert one == {
        "finish_run": 1,
        "_agent_run_after_update": 1,
        "_journal": 1,
        "_journal_complete": 1,
        "_agent_run_state_valid": 1,
        "_run_event_guard": 1,
    }


def test_a_watched_ending_still_wakes_its_tails(owner: psycopg.Connection, counted: psycopg.Connection):
    """One watched run in a batch: the batch's wake helper runs once, for the whole batch, in
    finish_runs and in finish_and_claim_runs alike; and finish_run of that run wakes it."""
    for _ in range(RUNS):
        enqueue(owner, uuid.uuid4())
    worker = counted
    runs = worker.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('calls-probe', %s, 30)", (RUNS,)
    ).fetchall()
    assert len(runs) == RUNS
    worker.execute("SELECT * FROM runrow.watch_runs(ARRAY[%s]::uuid[])", (runs[3][0],)).fetchall()
    acks = completed(runs)
    finish = calls(worker, "SELECT * FROM runrow.finish_runs(%s::jsonb)", (acks,))
    both = calls(
        worker, "SELECT * FROM runrow.finish_and_claim_runs(%s::jsonb, 'calls-probe', 1, 30)", (acks,)
    )
    one = calls(worker, "SELECT runrow.finish_run(%s, %s, 'completed')", runs[3])
    drain(owner)
    assert finish.get("_wake_tails_ended_batch") == 1, finish
    assert both.get("_wake_tails_ended_batch") == 1, both
    assert one.get("_wake_tails_ended") == 1, one


def test_an_empty_claim_runs_no_update(owner: psycopg.Connection, counted: psycopg.Connection):
    """The claim every idle worker makes when an enqueue wakes it but another takes the run: it
    finds nothing, so it writes nothing, and no UPDATE statement fires agent_run's statement
    trigger (before, an empty claim ran its final UPDATE-and-journal statement all the same:
    140-155 us of backend per call against 82-87 without it)."""
    drain(owner)
    walk = {"_claim": 1, "_claim_walk": 1}
    assert calls(counted, "SELECT * FROM runrow.claim_runs('idle-probe', 10, 30)") == {
        "claim_runs": 1,
        **walk,
    }
    assert calls(counted, "SELECT * FROM runrow.claim_run('idle-probe', 30)") == {"claim_run": 1, **walk}


def test_an_idle_reap_runs_no_argument_helper(owner: psycopg.Connection, counted: psycopg.Connection):
    """Every worker reaps on a timer, and nearly every pass finds nothing: valid arguments
    call no _require_* helper (each a statement and a search_path switch), bad ones still do
    (test_a_bad_argument_still_gets_its_helpers_error)."""
    drain(owner)
    assert calls(counted, "SELECT * FROM runrow.reap_expired_runs(30, 100)") == {"reap_expired_runs": 1}


FLEET_READS = """
    SELECT t.relname, t.seq_scan + coalesce(t.idx_scan, 0) FROM pg_stat_xact_user_tables AS t
    WHERE t.schemaname = 'runrow' AND t.relname IN ('rate_limit', 'tenant_budget')
"""


def fleet_reads(conn: psycopg.Connection, sql: str) -> dict[str, int]:
    """Scans of the fleet-limit tables one call of `sql` makes, from this backend's own
    transaction counters (exact, no flush), rolled back."""
    with conn.transaction(force_rollback=True):
        before = dict(conn.execute(FLEET_READS).fetchall())
        conn.execute(sql).fetchall()
        after = dict(conn.execute(FLEET_READS).fetchall())
    return {name: n - before.get(name, 0) for name, n in after.items()}


def test_an_empty_claim_reads_no_fleet_limit(owner: psycopg.Connection, counted: psycopg.Connection):
    """The fleet limits (blocked rate-limit keys, tenant budgets) are read once the walk has found
    a run, not before: an empty claim reads neither table (it read both, 83-91 us of backend per
    empty claim_runs against 78-84 without). A claim that finds a run reads each once."""
    drain(owner)
    claim = "SELECT * FROM runrow.claim_runs('idle-probe', 10, 30)"
    assert fleet_reads(counted, claim) == {"rate_limit": 0, "tenant_budget": 0}
    enqueue(owner, uuid.uuid4())
    assert fleet_reads(counted, claim) == {"rate_limit": 1, "tenant_budget": 1}


@pytest.mark.parametrize(
    ("sql", "params", "error"),
    [
        ("SELECT * FROM runrow.claim_runs('w', %s, 30)", (0,), "max_runs must be between 1 and 1000, got 0"),
        (
            "SELECT * FROM runrow.claim_runs('w', %s, 30)",
            (1001,),
            "max_runs must be between 1 and 1000, got 1001",
        ),
        ("SELECT * FROM runrow.claim_runs('w', 1, %s)", (None,), "lease_seconds must not be NULL"),
        ("SELECT * FROM runrow.heartbeat(%s, %s, 30)", (None, uuid.uuid4()), "run_id must not be NULL"),
        ("SELECT * FROM runrow.heartbeat(%s, %s, 30)", (uuid.uuid4(), None), "claim_token must not be NULL"),
        (
            "SELECT * FROM runrow.heartbeat(%s, %s, 3601)",
            (uuid.uuid4(), uuid.uuid4()),
            "lease_seconds must be between 1 and 3600, got 3601",
        ),
        (
            "SELECT runrow.append_events(%s, %s, %s)",
            (uuid.uuid4(), uuid.uuid4(), None),
            "events must not be NULL",
        ),
        (
            "SELECT * FROM runrow.reap_expired_runs(%s, 100)",
            (-1,),
            "grace_seconds must be between 0 and 86400, got -1",
        ),
        ("SELECT * FROM runrow.reap_expired_runs(30, %s)", (None,), "max_runs must not be NULL"),
        ("SELECT * FROM runrow.finish_runs(%s)", (None,), "runs must not be NULL"),
        ("SELECT * FROM runrow.finish_and_claim_runs(%s, 'w', 1, 30)", (None,), "runs must not be NULL"),
        (
            "SELECT * FROM runrow.finish_and_claim_runs('[]', 'w', %s, 30)",
            (0,),
            "max_runs must be between 1 and 1000, got 0",
        ),
        (
            "SELECT * FROM runrow.finish_and_claim_runs('[]', 'w', 1, %s)",
            (None,),
            "lease_seconds must not be NULL",
        ),
        (
            "SELECT runrow.finish_run(%s, %s, %s)",
            (uuid.uuid4(), uuid.uuid4(), None),
            "status must not be NULL",
        ),
        ("SELECT * FROM runrow.enqueue_run(%s, '\"hi\"', 'm')", (None,), "conversation_id must not be NULL"),
        # Two bad arguments: the first in the function's order is named, as before the tests.
        (
            "SELECT * FROM runrow.enqueue_run(%s, '\"\"', NULL)",
            (uuid.uuid4(),),
            "content must be a non-empty string or a non-empty array of content blocks",
        ),
        ("SELECT * FROM runrow.enqueue_run(%s, '\"hi\"', NULL)", (uuid.uuid4(),), "model must not be NULL"),
        (
            "SELECT * FROM runrow.enqueue_run(%s, '\"hi\"', 'm', max_attempts => 0)",
            (uuid.uuid4(),),
            "max_attempts must be between 1 and 100, got 0",
        ),
        (
            "SELECT * FROM runrow.enqueue_run(%s, '\"hi\"', 'm', metadata => NULL)",
            (uuid.uuid4(),),
            "metadata must not be NULL",
        ),
        (
            "SELECT * FROM runrow.enqueue_run(%s, '\"hi\"', 'm', start_in => interval '0', priority => NULL)",
            (uuid.uuid4(),),
            "start_in must be NULL or more than 0 and at most 366 days, got 00:00:00",
        ),
        (
            "SELECT * FROM runrow.enqueue_run(%s, '\"hi\"', 'm', priority => NULL)",
            (uuid.uuid4(),),
            "priority must not be NULL",
        ),
        (
            "SELECT * FROM runrow.enqueue_run(%s, '\"hi\"', 'm', concurrency_key => '',"
            " rate_limit_key => '')",
            (uuid.uuid4(),),
            "concurrency_key must be NULL or 1 to 200 characters",
        ),
        (
            "SELECT * FROM runrow.acquire_model_call(%s, %s, -1)",
            (uuid.uuid4(), uuid.uuid4()),
            "input_tokens_estimate must be between 0 and 100000000, got -1",
        ),
        (
            "SELECT * FROM runrow.acquire_model_call(%s, %s, 1)",
            (uuid.uuid4(), None),
            "claim_token must not be NULL",
        ),
        (
            "SELECT runrow.append_step(%s, %s, NULL, '[]')",
            (uuid.uuid4(), uuid.uuid4()),
            "kind must not be NULL",
        ),
        ("SELECT * FROM runrow.read_events(%s, 0, 100)", (None,), "run_id must not be NULL"),
        (
            "SELECT * FROM runrow.read_events(%s, -1, 100)",
            (uuid.uuid4(),),
            "after_seq must be between 0 and 9223372036854775806, got -1",
        ),
        (
            "SELECT * FROM runrow.read_events(%s, 0, 10001)",
            (uuid.uuid4(),),
            "max_events must be between 1 and 10000, got 10001",
        ),
        (
            "SELECT runrow.append_step(%s, %s, 'model_turn', NULL)",
            (uuid.uuid4(), uuid.uuid4()),
            "payload must not be NULL",
        ),
        (
            "SELECT * FROM runrow.begin_tool_call(%s, %s, %s, 't', '{}', 'pure')",
            (None, uuid.uuid4(), "a" * 64),
            "run_id must not be NULL",
        ),
        (
            "SELECT * FROM runrow.begin_tool_call(%s, %s, %s, NULL, '{}', 'pure')",
            (uuid.uuid4(), uuid.uuid4(), "a" * 64),
            "tool must not be NULL",
        ),
        (
            "SELECT * FROM runrow.begin_tool_call(%s, %s, %s, 't', NULL, 'pure')",
            (uuid.uuid4(), uuid.uuid4(), "a" * 64),
            "args must not be NULL",
        ),
        (
            "SELECT * FROM runrow.begin_tool_call(%s, %s, %s, 't', '{}', NULL)",
            (uuid.uuid4(), uuid.uuid4(), "a" * 64),
            "effect must not be NULL",
        ),
        (
            "SELECT runrow.complete_tool_call(%s, %s, %s, '1')",
            (uuid.uuid4(), uuid.uuid4(), None),
            "idempotency_key must not be NULL",
        ),
        (
            "SELECT runrow.complete_tool_call(%s, %s, %s, NULL)",
            (uuid.uuid4(), uuid.uuid4(), "a" * 64),
            "result must not be NULL",
        ),
        (
            "SELECT runrow.complete_tool_call(%s, %s, %s, '1', NULL)",
            (uuid.uuid4(), uuid.uuid4(), "a" * 64),
            "is_error must not be NULL",
        ),
        (
            "SELECT runrow.interrupt_tool_call(%s, %s, %s, 'why')",
            (uuid.uuid4(), None, "a" * 64),
            "claim_token must not be NULL",
        ),
        (
            "SELECT runrow.interrupt_tool_call(%s, %s, %s, NULL)",
            (uuid.uuid4(), uuid.uuid4(), "a" * 64),
            "reason must not be NULL",
        ),
        (
            "SELECT runrow.tool_call_key(%s, 0, 'toolu_1', 't', '{}')",
            (uuid.uuid4(),),
            "step_seq must be between 1 and 2147483647, got 0",
        ),
        (
            "SELECT runrow.tool_call_key(%s, 1, 'toolu_1', NULL, '{}')",
            (uuid.uuid4(),),
            "tool must not be NULL",
        ),
        (
            "SELECT runrow.tool_call_key(%s, 1, 'toolu_1', 't', NULL)",
            (uuid.uuid4(),),
            "args must not be NULL",
        ),
        (
            "SELECT * FROM runrow.claim_webhook_deliveries('w', %s)",
            (0,),
            "max_deliveries must be between 1 and 1000, got 0",
        ),
        (
            "SELECT * FROM runrow.claim_webhook_deliveries('w', 1, %s)",
            (None,),
            "lease_seconds must not be NULL",
        ),
        (
            "SELECT runrow.complete_webhook_delivery(%s, %s, 200)",
            (uuid.uuid4(), None),
            "claim_token must not be NULL",
        ),
        (
            "SELECT runrow.complete_webhook_delivery(%s, %s, %s)",
            (uuid.uuid4(), uuid.uuid4(), 302),
            "http_status must be between 200 and 299, got 302",
        ),
        (
            "SELECT runrow.fail_webhook_delivery(%s, %s, %s)",
            (uuid.uuid4(), uuid.uuid4(), None),
            "error must not be NULL",
        ),
        (
            "SELECT runrow.fail_webhook_delivery(%s, %s, 'x', max_attempts => %s)",
            (uuid.uuid4(), uuid.uuid4(), 0),
            "max_attempts must be between 1 and 100, got 0",
        ),
        (
            "SELECT runrow.fail_webhook_delivery(%s, %s, 'x', backoff_seconds => %s)",
            (uuid.uuid4(), uuid.uuid4(), None),
            "backoff_seconds must not be NULL",
        ),
        # The key's format, tested without the regex engine: still refused, and named.
        (
            "SELECT * FROM runrow.begin_tool_call(%s, %s, %s, 't', '{}', 'pure')",
            (uuid.uuid4(), uuid.uuid4(), "A" * 64),
            "idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns",
        ),
        (
            "SELECT runrow.complete_tool_call(%s, %s, %s, '1')",
            (uuid.uuid4(), uuid.uuid4(), "a" * 65),
            "idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns",
        ),
        (
            "SELECT runrow.interrupt_tool_call(%s, %s, %s, 'why')",
            (uuid.uuid4(), uuid.uuid4(), "a" * 63 + "g"),
            "idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns",
        ),
    ],
)
def test_a_bad_argument_still_gets_its_helpers_error(
    counted: psycopg.Connection, sql: str, params: tuple[object, ...], error: str
):
    """The tests in front of the helpers only decide whether to call them: a bad argument still
    gets the helper's error (its SQLSTATE, the argument named), as from every other function."""
    with pytest.raises((psycopg.errors.NullValueNotAllowed, psycopg.errors.InvalidParameterValue)) as raised:
        counted.execute(sql, params)
    assert raised.value.diag.message_primary == error


def test_valid_per_run_calls_run_no_argument_helper(owner: psycopg.Connection, counted: psycopg.Connection):
    """A run's enqueue, its model calls' admission, its steps and its stream's reads: valid
    arguments call no _require_* helper, each a PERFORM statement (twelve of them were about a
    sixth of an enqueue's backend time); bad ones still do
    (test_a_bad_argument_still_gets_its_helpers_error)."""
    drain(owner)
    enqueue_calls = calls(
        counted,
        "SELECT * FROM runrow.enqueue_run(%s, '\"hello\"'::jsonb, 'test-model', max_attempts => 3,"
        " start_in => interval '1 minute', priority => 5, fairness_key => 'tenant-a',"
        " concurrency_key => 'key-a', rate_limit_key => 'rl-a')",
        (uuid.uuid4(),),
    )
    enqueue(owner, uuid.uuid4())
    run_id, token = counted.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('helpers-probe', 1, 30)"
    ).fetchone()
    admit = calls(counted, "SELECT * FROM runrow.acquire_model_call(%s, %s, 100)", (run_id, token))
    step = calls(
        counted,
        "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)",
        (run_id, token, '[{"type": "text", "text": "hi"}]'),
    )
    read = calls(counted, "SELECT * FROM runrow.read_events(%s, 0, 100)", (run_id,))
    drain(owner)
    per_run = (
        ("enqueue_run", enqueue_calls),
        ("acquire_model_call", admit),
        ("append_step", step),
        ("read_events", read),
    )
    for name, made in per_run:
        assert made.get(name) == 1, (name, made)
        assert not [f for f in made if f.startswith("_require")], (name, made)


TOOL_TURN = (
    '[{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},'
    ' {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"q": "y"}}]'
)


def test_valid_tool_calls_run_no_argument_helper(owner: psycopg.Connection, counted: psycopg.Connection):
    """An agent's tool calls (its key, begin, then complete or interrupt): valid arguments call no
    _require_* helper, each a PERFORM statement (five or six a call, about a tenth of a tool
    call's backend work); bad ones still do (test_a_bad_argument_still_gets_its_helpers_error)."""
    drain(owner)
    enqueue(owner, uuid.uuid4(), tools=["lookup"])
    run_id, token = owner.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('tools-probe', 1, 30)"
    ).fetchone()
    seq = owner.execute(
        "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)", (run_id, token, TOOL_TURN)
    ).fetchone()[0]
    keys = [
        owner.execute(
            "SELECT runrow.tool_call_key(%s, %s, %s, 'lookup', %s::jsonb)", (run_id, seq, tool_use, args)
        ).fetchone()[0]
        for tool_use, args in (("toolu_1", '{"q": "x"}'), ("toolu_2", '{"q": "y"}'))
    ]
    begin = "SELECT * FROM runrow.begin_tool_call(%s, %s, %s, 'lookup', %s::jsonb, 'non_idempotent')"
    made = {
        "tool_call_key": calls(
            counted, "SELECT runrow.tool_call_key(%s, %s, 'toolu_1', 'lookup', '{}')", (run_id, seq)
        ),
        "begin_tool_call": calls(counted, begin, (run_id, token, keys[0], '{"q": "x"}')),
    }
    # calls() rolls back: begin both for real, then count their endings.
    owner.execute(begin, (run_id, token, keys[0], '{"q": "x"}')).fetchall()
    owner.execute(begin, (run_id, token, keys[1], '{"q": "y"}')).fetchall()
    made["complete_tool_call"] = calls(
        counted, "SELECT runrow.complete_tool_call(%s, %s, %s, '\"ok\"')", (run_id, token, keys[0])
    )
    made["interrupt_tool_call"] = calls(
        counted, "SELECT runrow.interrupt_tool_call(%s, %s, %s, 'worker stopping')", (run_id, token, keys[1])
    )
    drain(owner)
    for name, functions in made.items():
        assert functions.get(name) == 1, (name, functions)
        assert not [f for f in functions if f.startswith("_require")], (name, functions)
        # The key's format is one SQL expression the planner inlines into the IF: never a call.
        assert "_is_tool_call_key" not in functions, (name, functions)


def test_valid_webhook_calls_run_no_argument_helper(owner: psycopg.Connection, counted: psycopg.Connection):
    """A delivery's claim, completion and failure: valid arguments call no _require_* helper;
    bad ones still do (test_a_bad_argument_still_gets_its_helpers_error)."""
    made = {
        "claim_webhook_deliveries": calls(
            counted, "SELECT * FROM runrow.claim_webhook_deliveries('hooks-probe', 5)"
        ),
        "complete_webhook_delivery": calls(
            counted, "SELECT runrow.complete_webhook_delivery(%s, %s, 200)", (uuid.uuid4(), uuid.uuid4())
        ),
        "fail_webhook_delivery": calls(
            counted, "SELECT runrow.fail_webhook_delivery(%s, %s, 'timeout')", (uuid.uuid4(), uuid.uuid4())
        ),
    }
    for name, functions in made.items():
        assert functions.get(name) == 1, (name, functions)
        assert not [f for f in functions if f.startswith("_require")], (name, functions)
