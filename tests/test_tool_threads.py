"""Sync tools run in threads of their own, never in asyncio's default pool.

That pool (min(32, cores + 4) threads: 6 on 2 cores) also resolves host names for psycopg's
connects and httpx's requests. The resource audit: sync tools that waited long took every
thread, a worker whose connections were cut could not look its database's host up again, and
it gave all ten of its runs up while the database was there; only 6 of 10 tool calls started.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading

from pyworker.agent.tools import Tool

# One more call than the default pool has threads, and then some.
CALLS = min(32, (os.cpu_count() or 1) + 4) + 4
WHO = contextvars.ContextVar("who", default="nobody")


def waiting_tool(started: list[str], all_started: asyncio.Event, release: threading.Event) -> Tool:
    loop = asyncio.get_running_loop()

    def wait_for_release() -> str:
        started.append(WHO.get())
        if len(started) == CALLS:
            loop.call_soon_threadsafe(all_started.set)
        release.wait(30)
        return "released"

    return Tool(
        name="wait_for_release",
        description="waits until the test releases it",
        input_schema={"type": "object"},
        effect="pure",
        fn=wait_for_release,
        wants_key=False,
    )


async def test_every_sync_tool_starts_and_host_names_still_resolve() -> None:
    started: list[str] = []
    release = threading.Event()
    all_started = asyncio.Event()
    tool = waiting_tool(started, all_started, release)
    WHO.set("the run's context")
    calls = [asyncio.create_task(tool.call({}, "k" * 64)) for _ in range(CALLS)]
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_started.wait(), 5)
        assert len(started) == CALLS, (
            f"{len(started)} of {CALLS} sync tool calls started; the rest wait for a thread"
        )
        # What psycopg's connect and httpx do first with a host name, while every tool waits.
        loop = asyncio.get_running_loop()
        answers = await asyncio.wait_for(loop.getaddrinfo("localhost", 5432), 5)
        assert answers
        # The caller's context goes with the call (trace spans, as asyncio.to_thread did).
        assert set(started) == {"the run's context"}
    finally:
        release.set()
    assert await asyncio.gather(*calls) == ["released"] * CALLS


async def test_a_sync_tool_that_raises_hands_its_exception_over() -> None:
    def broken() -> None:
        raise SystemExit("a script it called exited")

    tool = Tool(
        name="broken",
        description="raises",
        input_schema={"type": "object"},
        effect="pure",
        fn=broken,
        wants_key=False,
    )
    try:
        await tool.call({}, "k" * 64)
    except SystemExit as exc:
        assert str(exc) == "a script it called exited"
    else:
        raise AssertionError("the tool's SystemExit was not handed over")
