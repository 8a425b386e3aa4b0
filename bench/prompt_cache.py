"""Prompt caching (issue 16): what a run pays for its input, with and without cache breakpoints.

Real runs through the agent loop (an in-process worker, the demo tools) against the fake
Messages API, whose cache answers as the API does (pyworker/fake/cache.py; tokens are bytes/4, the
minimum cacheable prefix is 1,024 tokens as for the Sonnet class). Each run is made twice, with
metadata.prompt_cache "off" and the default "5m", each against a fresh fake (an empty cache):

- the demo's run: `runrow demo`'s task, system prompt and tools, 12 steps (6 model requests);
- a 30-step run (15 requests) with a 3,000-token system prompt, the issue's example.

Reported per run (from runrow.run_usage, the step log): input tokens billed at the full price,
cache writes, cache reads, and the cost with PRICES. `python -m bench.prompt_cache` alone.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.common import cli, run_alone
from pyworker.agent import loop as agent
from pyworker.db import api
from pyworker.demo import run as demo
from pyworker.fake.scenarios import DEMO_SCRIPT, DEMO_TOOLS, Script, Text, Thinking, ToolCall, turn
from pyworker.fake.server import FakeModel
from pyworker.worker.process import Worker

# USD per million tokens, Claude Sonnet 4.5 list prices (https://platform.claude.com/docs/en/
# about-claude/pricing, "Model pricing" and "Prompt caching"): a 5-minute cache write is 1.25x the
# input price, a 1-hour write 2x, a cache read 0.1x.
PRICES = {"input": 3.00, "cache_write_5m": 3.75, "cache_write_1h": 6.00, "cache_read": 0.30, "output": 15.00}
PRICE_NOTE = (
    "prices: Claude Sonnet 4.5 list, USD/MTok: input 3.00, cache write (5m) 3.75, cache read 0.30, "
    "output 15.00 (platform.claude.com/docs/en/about-claude/pricing)"
)
LONG_SYSTEM = ("You are a careful assistant working over a small workspace. Follow the house rules. " * 146)[
    :12000
]
MODEL = "claude-fake-sonnet"


def _reading(step: int) -> Any:
    def build(request: Any) -> Any:
        calls = [ToolCall("read_file", {"path": "notes/todo.txt"})]
        if step == 13:
            calls.append(ToolCall("read_file", {"path": "notes/contacts.txt"}))
        return turn(Thinking(f"Step {step}: read the notes again."), Text(f"Reading, step {step}."), *calls)

    return build


# 13 turns of one read_file and one of two (29 steps), then the summary: 30 steps, 15 requests.
THIRTY_STEPS = Script((*(_reading(i) for i in range(14)), lambda request: turn(Text("Done: all read."))))


@dataclass(frozen=True)
class Case:
    name: str
    scenario: Script
    system: str
    task: str
    model: str


CASES = (
    Case("demo run (12 steps)", DEMO_SCRIPT, demo.SYSTEM, demo.TASK, demo.FAKE_MODEL),
    Case(
        "30-step run, 3,000-token system prompt",
        THIRTY_STEPS,
        LONG_SYSTEM,
        "Read the notes, fourteen times.",
        MODEL,
    ),
)


@dataclass(frozen=True)
class Totals:
    turns: int
    input: int
    output: int
    cache_read: int
    cache_write: int

    @property
    def cost(self) -> float:
        return (
            self.input * PRICES["input"]
            + self.cache_write * PRICES["cache_write_5m"]
            + self.cache_read * PRICES["cache_read"]
            + self.output * PRICES["output"]
        ) / 1e6


async def one_run(url: str, case: Case, mode: str, workdir: str) -> Totals:
    with FakeModel(case.scenario) as fake:
        config = {
            "tools_module": "pyworker.demo.tools",
            "anthropic_base_url": fake.base_url,
            "anthropic_api_key": "b",
        }
        worker = Worker(
            url,
            worker_id=f"bench-cache-{mode}",
            handler=agent.handle,
            config=config,
            lease_seconds=30,
            poll_seconds=0.2,
        )
        task = asyncio.create_task(worker.run(install_signals=False))
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                metadata = {**demo.METADATA, "prompt_cache": mode}
                enq = await api.enqueue_run(
                    conn,
                    uuid.uuid4(),
                    case.task,
                    case.model,
                    system_prompt=case.system,
                    tools=list(DEMO_TOOLS),
                    metadata=metadata,
                )
                deadline = time.monotonic() + 120
                while (ending := await api.get_run(conn, enq.run_id)).status not in (
                    "completed",
                    "failed",
                    "dead",
                ):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{case.name} ({mode}) did not finish")
                    await asyncio.sleep(0.1)
                if ending.status != "completed":
                    raise RuntimeError(f"{case.name} ({mode}) ended {ending.status}: {ending.error}")
                cur = await conn.execute("SELECT * FROM runrow.run_usage(run_id => %s)", (enq.run_id,))
                row = await cur.fetchone()
        finally:
            worker.request_stop()
            await task
    assert row is not None
    return Totals(*(int(v) for v in row))


async def bench(url: str) -> list[str]:
    lines = [
        "prompt caching: input tokens billed per run, prompt_cache off vs 5m (fake API, tokens = bytes/4)"
    ]
    with tempfile.TemporaryDirectory(prefix="runrow-bench-cache-") as workdir:
        os.environ["RUNROW_DEMO_DIR"] = workdir
        for case in CASES:
            off = await one_run(url, case, "off", workdir)
            on = await one_run(url, case, "5m", workdir)
            saved = 1 - on.cost / off.cost
            lines.append(f"  {case.name}, {off.turns} model requests:")
            lines.append(
                f"    off: {off.input:,} input tokens at full price; cost ${off.cost:.4f} "
                f"(output {off.output:,} tokens)"
            )
            lines.append(
                f"    5m:  {on.input:,} at full price, {on.cache_write:,} cache write (1.25x), "
                f"{on.cache_read:,} cache read (0.1x); cost ${on.cost:.4f}"
            )
            input_off = off.input * PRICES["input"]
            input_on = (
                on.input * PRICES["input"]
                + on.cache_write * PRICES["cache_write_5m"]
                + on.cache_read * PRICES["cache_read"]
            )
            lines.append(
                f"    saving: {saved:.0%} of the run's cost, {1 - input_on / input_off:.0%} of its input cost"
            )
    lines.append(f"  {PRICE_NOTE}")
    return lines


def main(argv: list[str] | None = None) -> None:
    cli("bench.prompt_cache", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    run_alone("prompt_cache", bench)


if __name__ == "__main__":
    main()
