"""API key and account errors are the fleet's problem, not the run's: the real SDK against the
fake Messages API answering every request as the API does while a key is revoked or the
account is out of credit (401 authentication_error, 402 billing_error, 403 permission_error
about the key, the 400 "Your credit balance is too low"). The key is blocked fleet-wide
(report_key_error), every run is deferred with its attempt given back, a few requests probe
the key while it lasts, and every run completes once it works again. Errors about the run's
own request (404 for its model, a 403 naming the model, any other 400) still fail it once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from agent_support import InProcessWorker, enqueue_agent, module_conn, module_db
from worker_support import run_row, wait_status, wait_until, worker_db

from pyworker.cli.limits import fleet_facts, fleet_summary
from pyworker.fake.faults import (
    Fault,
    billing_error,
    credit_balance_too_low,
    invalid_api_key,
    permission_denied,
    status_error,
)
from pyworker.fake.server import FakeModel

__all__ = ["module_conn", "module_db", "worker_db"]

KEY = "test-key"
TERMINAL = {"completed", "failed", "cancelled", "dead"}
RUNS = 6
OUTAGE_SECONDS = 4.0
BLOCK = 6.0  # test_deferred_runs_go_as_soon_as_the_key_works: every block of its streak


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel("text", api_key=KEY) as server:
        yield server


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config = {
        "anthropic_base_url": fake.base_url,
        "anthropic_api_key": KEY,
        # short blocks, so an outage of a few seconds sees the block grow and the key probed
        "key_error_first_block": 0.5,
        "key_error_max_block": 2.0,
    }
    with InProcessWorker(module_db, "keys", config=config, concurrency=2) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    fake.set_scenario("text")
    return module_conn


async def _status_lines(dsn: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return str(dict(fleet_summary(await fleet_facts(conn)))["rate_limit_keys_blocked"])


def finish(db: psycopg.Connection, run: uuid.UUID, timeout: float = 30) -> dict[str, Any]:
    wait_status(db, run, TERMINAL, timeout)
    return run_row(db, run)


OUTAGES = {
    "401": invalid_api_key(),
    "402-billing": billing_error(),
    "400-credit-balance": credit_balance_too_low(),
    "403-key": permission_denied(),
    # The word "model" alone is no model of the run's: the review saw this 403 fail every run.
    "403-models-suspended": permission_denied("Your organization's access to models has been suspended"),
}


@pytest.mark.parametrize("fault", list(OUTAGES.values()), ids=list(OUTAGES))
def test_an_account_error_defers_every_run_until_the_key_works(db, fake, fault: Fault, caplog) -> None:
    caplog.set_level(logging.INFO)
    model = f"claude-fake-key-{fault.status}-{uuid.uuid4().hex[:6]}"  # a rate_limit_key of its own
    fake.set_account_error(fault)
    runs = [
        enqueue_agent(db, f"job {i}", model=model, system=None, tools=[], metadata={}, max_attempts=1)
        for i in range(RUNS)
    ]
    time.sleep(OUTAGE_SECONDS)
    rows = [run_row(db, r) for r in runs]
    assert [r["status"] for r in rows if r["status"] in TERMINAL] == [], [r["error"] for r in rows]
    sent = len(fake.requests)
    # Two in flight when the first error lands (the worker's two slots), then one probe per
    # block (0.5 s, 1 s, 2 s): not one request per run, nor one per poll.
    assert 1 <= sent <= 6, [r.status for r in fake.requests]
    assert all(r.status == fault.status for r in fake.requests)
    # What an operator sees: the key's error, and how long it has lasted. From rate_limits (every
    # key), not rate_limit_blocks (keys blocked this instant): between the end of a block and
    # the probe's answer the key is briefly unblocked, and a loaded box (make test's other
    # pytest worker) landed the check there.
    block = db.execute(
        "SELECT key_error, key_errors FROM runrow.rate_limits WHERE rate_limit_key = %s", [model]
    ).fetchone()
    assert block is not None and fault.message in block[0] and block[1] >= 2, block
    # runrow status lists blocked keys; the same brief gap between a block and its probe's hold
    # can fall on one look, so it is asked again for a few seconds.
    deadline = time.monotonic() + 5
    status = asyncio.run(_status_lines(db.info.dsn))
    while "KEY ERROR" not in status and time.monotonic() < deadline:
        time.sleep(0.1)
        status = asyncio.run(_status_lines(db.info.dsn))
    assert "KEY ERROR" in status and fault.message in status and model in status, status

    fake.set_account_error(None)  # the key rotated, the credit topped up
    rows = [finish(db, r) for r in runs]
    ended = [(r["status"], r["attempt"]) for r in rows]
    assert ended == [("completed", 1)] * RUNS, [r["error"] for r in rows]
    # After the outage one answered request per run (none paid twice). A probe may still go out
    # between the count above and the fix (the status look takes a moment): a refused one more.
    answered = [r for r in fake.requests if r.status == 200]
    refused = [r for r in fake.requests if r.status != 200]
    assert len(answered) == RUNS and all(r.status == fault.status for r in refused), fake.requests
    assert sent <= len(refused) <= sent + 2, [r.status for r in fake.requests]
    state = db.execute(
        "SELECT key_errors, key_error FROM runrow.rate_limit WHERE rate_limit_key = %s", [model]
    ).fetchone()
    assert state == (0, None), "the first answer of a working key ends the streak"
    # Loud once per change, not once per run or per request.
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "key" in r.getMessage()]
    assert [m for lvl, m in said if lvl == logging.ERROR and fault.message in m] != []
    assert len([m for lvl, m in said if lvl == logging.ERROR]) == 1, said
    assert len([m for lvl, m in said if "works again" in m]) == 1, said


RUN_ERRORS = {
    "404-model": status_error(404, message="model: claude-nope"),
    "403-model": permission_denied("Your organization does not have access to model claude-fake-1"),
    "400-request": status_error(400, message="messages.0.content: Field required"),
}


@pytest.mark.parametrize("fault", list(RUN_ERRORS.values()), ids=list(RUN_ERRORS))
def test_an_error_about_the_run_itself_fails_it_once(db, fake, fault: Fault) -> None:
    fake.inject(fault)
    run = enqueue_agent(db, "job", system=None, tools=[], metadata={}, max_attempts=3)
    row = finish(db, run)
    assert (row["status"], row["attempt"], len(fake.requests)) == ("failed", 1, 1), row["error"]
    assert fault.message in row["error"]


def test_deferred_runs_go_as_soon_as_the_key_works(worker_db: str) -> None:
    """The runs deferred while the key is blocked (defer_run: the first to meet the error, and
    those that ask while the probe is out, told a wait longer than rate_limit_max_wait) are due
    the moment the probe is answered, as the runs the claim held to the block's end are. They
    were deferred for the wait they were told, counted from an earlier transaction, so their
    not_before fell just past the block and the probe's answer, lifting only the block's own
    end, missed them: they waited out one more block (up to key_error_max_block, 300 s) with
    the key working. Its own database, worker and fake: blocks of BLOCK seconds and waits over
    0.5 s deferred, so the deferrals happen and the old wait is long enough to tell."""
    config = {
        "key_error_first_block": BLOCK,
        "key_error_max_block": BLOCK,
        "rate_limit_max_wait": 0.5,
    }
    with (
        psycopg.connect(worker_db, autocommit=True) as db,
        FakeModel("text", api_key=KEY) as fake,
        InProcessWorker(
            worker_db,
            "keys-deferred",
            config={**config, "anthropic_base_url": fake.base_url, "anthropic_api_key": KEY},
            concurrency=RUNS,
        ),
    ):
        fake.set_account_error(invalid_api_key())
        runs = [
            enqueue_agent(db, f"job {i}", system=None, tools=[], metadata={}, max_attempts=1)
            for i in range(RUNS)
        ]
        key = "claude-fake-1"  # enqueue_agent's model, the runs' rate_limit_key

        def block_end() -> Any:
            row = db.execute(
                "SELECT key_error_until FROM runrow.rate_limit WHERE rate_limit_key = %s AND key_errors > 0",
                [key],
            ).fetchone()
            return row and row[0]

        first_block_end = wait_until(block_end, 15, "the key blocked for its error")
        fake.set_account_error(None)  # fixed while its first block lasts
        fixed = time.monotonic()
        rows = [finish(db, r, timeout=4 * BLOCK) for r in runs]
        took = time.monotonic() - fixed
        assert [(r["status"], r["attempt"]) for r in rows] == [("completed", 1)] * RUNS, rows
        deferred = db.execute(
            "SELECT count(DISTINCT run_id) FROM runrow.run_event "
            "WHERE type = 'run_requeued' AND (payload ->> 'deferred')::boolean AND run_id = ANY(%s)",
            [runs],
        ).fetchone()[0]
        assert deferred >= 2, "the first runs to meet the error, and the ones told to wait for the probe"
        # Database clock: from the end of the first block (the probe goes then, and the key
        # works) to the last run's end. Deferred past the hold the probe put on the key, the
        # last run went a whole BLOCK after it.
        after_block = db.execute(
            "SELECT extract(EPOCH FROM max(finished_at) - %s)::float8 "
            "FROM runrow.agent_run WHERE id = ANY(%s)",
            [first_block_end, runs],
        ).fetchone()[0]
        assert after_block < BLOCK / 2, (after_block, took)
        # Wall clock from the fix: the rest of the first block, then the probe and the runs; a
        # deferral missed by the probe's answer made it two blocks.
        assert took < 1.5 * BLOCK, (after_block, took)


OWN_REQUEST = "uses-a-beta-the-organisation-may-not"
OTHERS = 4


def test_a_403_about_one_runs_own_request_fails_it_once(db, fake) -> None:
    """A 403 permission_error whose message does not name the run's model reads like one about
    the key (model.is_key_error): a request using a beta, a tool type or a file the organisation
    may not use. Refused for that run only, it was deferred for ever with its attempt given back,
    each retry blocking every run of the key again. Now: refused again after the key answered
    another run's request since its last refusal, the run fails once (report_key_error), and the
    key's other runs complete."""
    model = f"claude-fake-own-{uuid.uuid4().hex[:6]}"  # a rate_limit_key of its own
    refusal = permission_denied("This organization does not have access to the requested beta feature")
    fake.refuse_requests_with(OWN_REQUEST, refusal)
    own = enqueue_agent(
        db, f"job {OWN_REQUEST}", model=model, system=None, tools=[], metadata={}, max_attempts=3
    )
    others = [
        enqueue_agent(db, f"job {i}", model=model, system=None, tools=[], metadata={}, max_attempts=1)
        for i in range(OTHERS)
    ]
    row = finish(db, own)
    assert (row["status"], row["attempt"]) == ("failed", 1), row["error"]
    assert refusal.message in row["error"] and "not the key" in row["error"], row["error"]
    ended = [(r["status"], r["attempt"]) for r in (finish(db, r) for r in others)]
    assert ended == [("completed", 1)] * OTHERS
    refused = [r for r in fake.requests if r.status == 403]
    answered = [r for r in fake.requests if r.status == 200]
    assert len(answered) == OTHERS, [r.status for r in fake.requests]
    # The first refusal blocks the key (the key might be the trouble); the one after another
    # run's request was answered ends the run. Between the two, the run may win a probe or two
    # of its key before another run does: each is one more block, never one without end.
    assert 2 <= len(refused) <= 4, [r.status for r in fake.requests]
    state = db.execute(
        "SELECT key_errors, key_error FROM runrow.rate_limit WHERE rate_limit_key = %s", [model]
    ).fetchone()
    assert state == (0, None), "the run's last refusal blocked nothing"
