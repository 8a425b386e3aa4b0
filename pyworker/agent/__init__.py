"""The agent loop: model stream, history rebuild, tool calls, and the tool registry users import.

Imports pyworker.db and pyworker.worker; never the fake Messages API, HTTP, CLI or demo.
`pyworker.agent:handle` is the worker's default handler.
"""

from __future__ import annotations

from typing import Any

__all__ = ["handle"]


def __getattr__(name: str) -> Any:
    # Lazy, so importing pyworker.agent.tools (every tool module does) does not load the loop and the SDK.
    if name == "handle":
        from pyworker.agent.loop import handle

        return handle
    raise AttributeError(name)
