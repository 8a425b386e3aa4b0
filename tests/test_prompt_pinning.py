"""A run pinned to prompt v1 keeps v1 after v2 is registered and the workers restart.

Run 1 (model 1, system prompt v1, tools v1) is SIGKILLed mid-run. Then prompt v2 is registered by
enqueueing run 2 with another model, a reworded system prompt and changed tool definitions, and a
new worker starts (with different worker configuration). Every request the model API receives for
run 1, before and after the restart, carries model 1, system v1 and tools v1; run 2's carry v2.
With thinking on, a resumed run 1 sent with v2 would also be refused by the signature check.
"""

from __future__ import annotations

import copy
from typing import Any

from agent_support import QUICK_TAKEOVER, ForkedWorker, agent_env, enqueue_agent, steps, undecorated
from worker_support import db, run_row, wait_status, wait_until, worker_db

from pyworker.fake.scenarios import DEMO_TOOLS
from pyworker.fake.server import FakeModel, RecordedRequest

__all__ = ["db", "worker_db"]

SYSTEM_V1 = "You are the status assistant, v1. Use the tools."
SYSTEM_V2 = "You are the status assistant, v2. Be brief; use the tools."
TOOLS_V1 = list(DEMO_TOOLS)
TOOLS_V2 = copy.deepcopy(TOOLS_V1)
for definition in TOOLS_V2:
    definition["description"] += " (v2)"
OPTIONS = {**QUICK_TAKEOVER, "concurrency": 2}


def first_user_text(request: RecordedRequest) -> Any:
    return undecorated(request.body["messages"][0])["content"]


def test_run_pinned_to_v1_keeps_v1_after_v2_and_a_worker_restart(db, worker_db, tmp_path) -> None:
    with FakeModel("demo") as fake:
        env = agent_env(fake.base_url, tmp_path, tool_delay="0.3")
        a = ForkedWorker(worker_db, "before-deploy", env, **OPTIONS)
        run1 = enqueue_agent(db, "Task one.", model="claude-fake-1", system=SYSTEM_V1, tools=TOOLS_V1)
        wait_until(lambda: len(steps(db, run1)) >= 3, 30, "run 1 at step 3")
        a.kill()
        prompt1 = db.execute("SELECT prompt_id FROM runrow.agent_run WHERE id = %s", (run1,)).fetchone()

        # The deploy: a new prompt version is registered and the workers restart with new config.
        run2 = enqueue_agent(db, "Task two.", model="claude-fake-2", system=SYSTEM_V2, tools=TOOLS_V2)
        b_env = {**env, "RUNROW_MODEL": "claude-fake-2", "RUNROW_SYSTEM_PROMPT": SYSTEM_V2}
        b = ForkedWorker(worker_db, "after-deploy", b_env, **OPTIONS)
        try:
            assert wait_status(db, run2, {"completed", "failed", "dead"}, 30) == "completed"
            assert wait_status(db, run1, {"completed", "failed", "dead"}, 30) == "completed"
        finally:
            b.kill()

    row1 = db.execute(
        "SELECT prompt_id, attempt, worker_id FROM runrow.agent_run WHERE id = %s", (run1,)
    ).fetchone()
    row2 = db.execute("SELECT prompt_id FROM runrow.agent_run WHERE id = %s", (run2,)).fetchone()
    assert row1 is not None and row2 is not None and prompt1 is not None
    assert row1 == (prompt1[0], 2, "after-deploy")  # resumed by the new worker, same prompt
    assert row2[0] != prompt1[0]
    one = [r for r in fake.requests if first_user_text(r) == "Task one."]
    two = [r for r in fake.requests if first_user_text(r) == "Task two."]
    assert len(one) == 6 and len(two) == 6
    resumed = one[2:]  # requests 3..6 of run 1 were sent by the worker started after v2
    assert len(resumed) == 4
    for request in one:
        assert request.body["model"] == "claude-fake-1"
        assert undecorated(request.body)["system"] == SYSTEM_V1
        assert undecorated(request.body)["tools"] == TOOLS_V1
        assert request.status == 200
    for request in two:
        body = undecorated(request.body)
        assert (body["model"], body["system"], body["tools"]) == (
            "claude-fake-2",
            SYSTEM_V2,
            TOOLS_V2,
        )
    assert run_row(db, run1)["result"]["stop_reason"] == "end_turn"
