"""The tools of `runrow demo`: a tool module as a user writes one.

    runrow worker --tools pyworker.demo_tools

They work on a workspace folder and count what they do, so the demo can prove that a killed worker
repeated no side effect:

- the workspace is `$RUNROW_DEMO_DIR/workspace` (seeded with two notes on first use);
- every time a tool body *runs*, one JSON line {tool, effect, key, pid} is appended to
  `$RUNROW_DEMO_DIR/executions.jsonl` (one O_APPEND write per line, so two worker processes
  can share the file);
- `send_email` is the non-idempotent effect: each execution is one more email (a file in
  `workspace/outbox/`). The demo's promise is that it runs exactly once, kill or no kill;
- `$RUNROW_DEMO_TOOL_DELAY` (seconds, default 0) is how long each tool takes, so a person can
  watch the calls and the demo's kill lands inside a tool call rather than racing it.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pyworker.tools import Effect, ToolError, registry, tool

NAMES = ("list_files", "read_file", "send_email", "write_file")
PATH_ONLY = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
SEED_FILES = {
    "notes/todo.txt": "- ship durable agent runs on PostgreSQL\n- send the weekly status email\n",
    "notes/contacts.txt": "team: team@example.com\n",
}
EXECUTIONS = "executions.jsonl"


def demo_dir() -> Path:
    return Path(os.environ.get("RUNROW_DEMO_DIR", "runrow-demo")).resolve()


def workspace() -> Path:
    root = demo_dir() / "workspace"
    if not (root / "notes").exists():
        seed(root)
    return root


def seed(root: Path) -> None:
    for name, text in SEED_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(text)


def _inside(relative: str) -> Path:
    root = workspace()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ToolError(f"{relative!r} is outside the workspace")
    return path


def _executed(name: str, effect: Effect, key: str) -> None:
    """Count one execution of a tool body, then take the tool's time."""
    line = json.dumps({"tool": name, "effect": effect, "key": key, "pid": os.getpid()}) + "\n"
    fd = os.open(demo_dir() / EXECUTIONS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    delay = float(os.environ.get("RUNROW_DEMO_TOOL_DELAY", "0") or 0)
    if delay > 0:
        time.sleep(delay)


@tool(description="List the files under a directory of the workspace.", input_schema=PATH_ONLY, effect="pure")
def list_files(path: str, idempotency_key: str) -> str:
    base = _inside(path)
    names = sorted(str(p.relative_to(workspace())) for p in base.rglob("*") if p.is_file())
    _executed("list_files", "pure", idempotency_key)
    return "\n".join(names)


@tool(description="Read a text file of the workspace.", input_schema=PATH_ONLY, effect="pure")
def read_file(path: str, idempotency_key: str) -> str:
    target = _inside(path)
    if not target.is_file():
        raise ToolError(f"no such file: {path}")
    _executed("read_file", "pure", idempotency_key)
    return target.read_text()


@tool(
    description="Send an email. Not idempotent: every call sends one more email.",
    input_schema={
        "type": "object",
        "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
        "required": ["to", "subject", "body"],
    },
    effect="non_idempotent",
)
def send_email(to: str, subject: str, body: str, idempotency_key: str) -> dict[str, Any]:
    outbox = workspace() / "outbox"
    outbox.mkdir(exist_ok=True)
    number = len(list(outbox.iterdir())) + 1
    (outbox / f"{number:03d}.eml").write_text(f"To: {to}\nSubject: {subject}\n\n{body}\n")
    _executed("send_email", "non_idempotent", idempotency_key)
    return {"sent": True, "to": to, "message_id": f"<{number:03d}.{idempotency_key[:12]}@demo.invalid>"}


@tool(
    description="Write a text file of the workspace (overwrites).",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
    effect="idempotent",
)
def write_file(path: str, content: str, idempotency_key: str) -> str:
    target = _inside(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    _executed("write_file", "idempotent", idempotency_key)
    return f"wrote {len(content)} characters to {path}"


def definitions() -> list[dict[str, Any]]:
    """The Messages API definitions of the demo tools, pinned on the demo's run."""
    out = []
    for name in NAMES:
        t = registry.get(name)
        assert t is not None, name
        out.append(t.definition())
    return out


def effects() -> dict[str, str]:
    """Tool name -> effect class."""
    return {name: t.effect for name in NAMES if (t := registry.get(name)) is not None}


def executions(root: Path | None = None) -> list[dict[str, Any]]:
    """Every recorded execution, oldest first."""
    path = (root or demo_dir()) / EXECUTIONS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def execution_counts(root: Path | None = None) -> Counter[str]:
    return Counter(e["tool"] for e in executions(root))
