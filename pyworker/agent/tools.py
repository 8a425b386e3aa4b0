"""Tools: plain Python functions, sync or async, registered with a decorator.

    from pyworker.agent.tools import tool

    @tool(
        description="Send an email to one recipient.",
        input_schema={"type": "object", "properties": {"to": {"type": "string"},
                      "body": {"type": "string"}}, "required": ["to", "body"]},
        effect="non_idempotent",
    )
    async def send_email(to: str, body: str, idempotency_key: str) -> dict:
        return await mailer.send(to, body, idempotency_key=idempotency_key)

The effect class decides what a resumed attempt does (SPEC.md, "Durable steps and tools"):
`pure` and `idempotent` tools simply run again, `non_idempotent` tools run again with the
same idempotency key unless a result was recorded, `irreversible` tools wait for a person's
approval and are never re-run after a crash without one. A tool that declares an
`idempotency_key` parameter receives the key derived from its position in the run, so it
can pass it downstream (Stripe, your own API). A tool that raises produces a `tool_result`
with `is_error: true` that the model sees; the run does not crash.

Cooperative cancellation: a tool that declares a `cancel` parameter receives the stop signal,
an `asyncio.Event` (async tools) or a `threading.Event` (sync tools, which run in a thread).
When the run is stopped while the tool runs, the event is set and the worker waits up to the
tool's `cancel_grace` seconds (default 10) for it to return. The tool then either returns (its
effect is complete: the result is recorded) or raises `ToolCancelled` (it stopped part-way).
A call cut short (ToolCancelled, any other exception after the signal, or past the grace) is
recorded by its effect class: `pure`/`idempotent` get a "cancelled" error result (or run again
on a resumed attempt), `non_idempotent`/`irreversible` become `uncertain`: never run again
without a person. A tool without a `cancel` parameter is awaited to its end, except an async
`pure` or `idempotent` one, which is cancelled at once (asyncio cancellation) since running it
again is harmless.

    @tool(description="Wait for a report.", input_schema=..., effect="pure", cancel_grace=5)
    async def wait_for_report(report_id: str, cancel: asyncio.Event) -> str:
        while not cancel.is_set():
            if (done := await poll(report_id)) is not None:
                return done
            await wait_event(cancel, 2)  # pyworker.db.aio; asyncio.wait_for can drop a cancel on 3.11
        raise ToolCancelled("stopped before the report was ready")

Load a module of tools with `runrow worker --tools package.module`: importing it runs the
decorators, which register into the default registry.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pyworker.db.threads import in_own_thread
from pyworker.worker.handler import importable_from_cwd

log = logging.getLogger("runrow.tools")

Effect = Literal["pure", "idempotent", "non_idempotent", "irreversible"]
EFFECTS: tuple[str, ...] = ("pure", "idempotent", "non_idempotent", "irreversible")


DEFAULT_CANCEL_GRACE = 10.0
# What a cooperative tool receives as `cancel`: set once, when the run is stopped.
CancelSignal = asyncio.Event | threading.Event


class ToolError(Exception):
    """Raise from a tool to give the model a clean error message (is_error tool_result)."""


class ToolCancelled(Exception):
    """Raise from a tool that stopped part-way because its `cancel` signal was set: the call
    is recorded as cut short (uncertain when non_idempotent or irreversible)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    effect: Effect
    fn: Callable[..., Any]
    wants_key: bool
    wants_cancel: bool = False
    cancel_grace: float = DEFAULT_CANCEL_GRACE

    def definition(self) -> dict[str, Any]:
        """The Messages API tool definition."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def new_cancel_signal(self) -> CancelSignal:
        """The event this tool watches: asyncio's on the loop, threading's in a thread."""
        return asyncio.Event() if self.is_async else threading.Event()

    async def call(
        self, args: dict[str, Any], idempotency_key: str, cancel: CancelSignal | None = None
    ) -> Any:
        kwargs = dict(args)
        if self.wants_key:
            kwargs["idempotency_key"] = idempotency_key
        if self.wants_cancel:
            kwargs["cancel"] = cancel if cancel is not None else self.new_cancel_signal()
        if self.is_async:
            return await self.fn(**kwargs)
        # A sync tool must not block the event loop (heartbeats run there), nor hold a thread of
        # asyncio's default pool (pyworker.db.threads says why).
        return await in_own_thread(self.fn, **kwargs)


@dataclass
class ToolRegistry:
    tools: dict[str, Tool] = field(default_factory=dict)

    def register(self, t: Tool) -> Tool:
        if t.name in self.tools and self.tools[t.name].fn is not t.fn:
            raise ValueError(f"tool {t.name!r} is already registered by {self.tools[t.name].fn!r}")
        self.tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def definitions(self) -> list[dict[str, Any]]:
        return [t.definition() for t in self.tools.values()]


registry = ToolRegistry()
# The tools each module registered, by module name: a worker started with `--tools M` uses
# exactly M's tools, whatever else the process imported (two modules may both define, say, a
# `send_email`; the default registry keeps the first and warns).
module_registries: dict[str, ToolRegistry] = {}

# The Messages API's rule for a custom tool's name; enqueue_run refuses any other (22023), so a
# module's tool with such a name fails at import, not on every run the service pins it on.
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")


def tool(
    name: str | None = None,
    *,
    input_schema: dict[str, Any],
    description: str | None = None,
    effect: Effect = "pure",
    into: ToolRegistry | None = None,
    cancel_grace: float = DEFAULT_CANCEL_GRACE,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a tool. The function itself is returned unchanged.
    `cancel_grace`: seconds a tool that takes `cancel` gets to return after a stop."""
    if effect not in EFFECTS:
        raise ValueError(f"effect must be one of {', '.join(EFFECTS)}, got {effect!r}")
    if input_schema.get("type") != "object":
        raise ValueError('input_schema must be a JSON schema with "type": "object"')
    if isinstance(cancel_grace, bool) or not isinstance(cancel_grace, int | float):
        raise ValueError(f"cancel_grace must be a number of seconds, got {cancel_grace!r}")
    if not (math.isfinite(cancel_grace) and 0 < cancel_grace <= 3600):
        raise ValueError(f"cancel_grace must be more than 0 and at most 3600 seconds, got {cancel_grace!r}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        params = inspect.signature(fn).parameters
        tool_name = fn.__name__ if name is None else name
        if "cancel" in params and "cancel" in (input_schema.get("properties") or {}):
            raise ValueError(
                f"tool {tool_name!r}: the parameter `cancel` receives the stop signal, so the "
                "input_schema cannot have a property of that name"
            )
        if not TOOL_NAME.fullmatch(tool_name):
            raise ValueError(
                f"tool name {tool_name!r} must be 1 to 128 letters, digits, '_' or '-' "
                "(the Messages API's rule): give the decorator name=..."
            )
        doc = inspect.getdoc(fn) or ""
        t = Tool(
            name=tool_name,
            description=description or doc.split("\n\n")[0] or tool_name,
            input_schema=input_schema,
            effect=effect,
            fn=fn,
            wants_key="idempotency_key" in params,
            wants_cancel="cancel" in params,
            cancel_grace=float(cancel_grace),
        )
        if into is not None:
            into.register(t)
            return fn
        module_registries.setdefault(fn.__module__, ToolRegistry()).register(t)
        existing = registry.get(t.name)
        if existing is not None and existing.fn.__module__ != fn.__module__:
            log.info(
                "tool %r of %s is not in the default registry: %s registered that name first",
                t.name,
                fn.__module__,
                existing.fn.__module__,
            )
        else:
            registry.register(t)
        return fn

    return decorate


def load_module(path: str) -> ToolRegistry:
    """Import a user's tool module (`package.module`); its decorators register its tools.
    Returns the registry of exactly the tools that module defines."""
    if path.startswith("."):  # import_module raises TypeError for a relative name
        raise ValueError(f"tools module {path!r}: give its absolute dotted path, for example myapp.tools")
    importable_from_cwd()
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"cannot import tools module {path!r}: {exc}. Give a dotted module path importable "
            "from the worker's working directory or PYTHONPATH, for example myapp.tools."
        ) from exc
    found = module_registries.get(module.__name__)
    if found is None:
        raise ValueError(f"tools module {path!r} defines no tools: decorate functions with @tool(...)")
    return found
