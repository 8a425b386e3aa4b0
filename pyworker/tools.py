"""Tools: plain Python functions, sync or async, registered with a decorator.

    from pyworker.tools import tool

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

Load a module of tools with `runrow worker --tools package.module`: importing it runs the
decorators, which register into the default registry.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger("runrow.tools")

Effect = Literal["pure", "idempotent", "non_idempotent", "irreversible"]
EFFECTS: tuple[str, ...] = ("pure", "idempotent", "non_idempotent", "irreversible")


class ToolError(Exception):
    """Raise from a tool to give the model a clean error message (is_error tool_result)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    effect: Effect
    fn: Callable[..., Any]
    wants_key: bool

    def definition(self) -> dict[str, Any]:
        """The Messages API tool definition."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    async def call(self, args: dict[str, Any], idempotency_key: str) -> Any:
        kwargs = dict(args)
        if self.wants_key:
            kwargs["idempotency_key"] = idempotency_key
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        # A sync tool must not block the event loop (heartbeats run there).
        return await asyncio.to_thread(self.fn, **kwargs)


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


def tool(
    name: str | None = None,
    *,
    input_schema: dict[str, Any],
    description: str | None = None,
    effect: Effect = "pure",
    into: ToolRegistry | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a tool. The function itself is returned unchanged."""
    if effect not in EFFECTS:
        raise ValueError(f"effect must be one of {', '.join(EFFECTS)}, got {effect!r}")
    if input_schema.get("type") != "object":
        raise ValueError('input_schema must be a JSON schema with "type": "object"')

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        params = inspect.signature(fn).parameters
        doc = inspect.getdoc(fn) or ""
        t = Tool(
            name=name or fn.__name__,
            description=description or doc.split("\n\n")[0] or (name or fn.__name__),
            input_schema=input_schema,
            effect=effect,
            fn=fn,
            wants_key="idempotency_key" in params,
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
