"""The demo's tools (`runrow demo`, the agent tests): a tool module as a user writes one.

    runrow worker --tools pyworker.demo.tools

They work on a workspace folder and record what they do the way a downstream service would, so a
demo or a test can prove that a killed worker repeated no side effect:

- `$RUNROW_DEMO_DIR` (default ./runrow-demo) holds `workspace/` (seeded with two notes on first
  use) and the downstream record `effects.json`;
- the record has one row per idempotency key (the first result for a key wins: a repeated call
  with the same key is not a second email) and counts how often a tool body ran with that key,
  so `effects` rows are what happened downstream and `executions` what the tools actually ran;
- `send_email` is the non-idempotent effect: every call with a *new* key sends one more email,
  so it passes its key to the "mail service". `delete_file` is irreversible (a person approves
  it first); the demo does not offer it to its model;
- `$RUNROW_DEMO_TOOL_DELAY` (seconds, default 0) is how long each tool takes after its effect:
  a person can watch the calls, and a kill lands inside a tool call, after its effect and before
  its result is recorded, rather than racing it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from pyworker.agent.tools import ToolError, module_registries, tool

# The tools the demo's run is given (and the fake demo scenario calls).
NAMES = ("list_files", "read_file", "send_email", "write_file")
PATH_ONLY = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
SEED_FILES = {
    "notes/todo.txt": "- ship durable agent runs on PostgreSQL\n- send the weekly status email\n",
    "notes/contacts.txt": "team: team@example.com\n",
}
RECORD_FILE = "effects.json"


class Record(NamedTuple):
    """One row of the downstream record."""

    idempotency_key: str
    tool: str
    args: dict[str, Any]
    executions: int


def demo_dir() -> Path:
    return Path(os.environ.get("RUNROW_DEMO_DIR", "runrow-demo")).resolve()


def workspace(root: Path | None = None) -> Path:
    """The workspace under `root` (default: the demo folder), seeded on first use."""
    path = (root or demo_dir()) / "workspace"
    if not (path / "notes").exists():
        seed(path)
    return path


def seed(path: Path) -> None:
    for name, text in SEED_FILES.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.write_text(text)


def _inside(relative: str) -> Path:
    root = workspace()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ToolError(f"{relative!r} is outside the workspace")
    return path


@contextlib.contextmanager
def _locked_record(root: Path) -> Any:
    """The record file, under an exclusive lock (two workers' tools may write at once)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / (RECORD_FILE + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = root / RECORD_FILE
        yield path, (json.loads(path.read_text()) if path.exists() else {})


def _record(tool_name: str, key: str, args: dict[str, Any], result: Any) -> Any:
    """The downstream service: the first result for a key wins; every execution is counted.
    Then the tool's time passes."""
    with _locked_record(demo_dir()) as (path, rows):
        row = rows.setdefault(key, {"tool": tool_name, "args": args, "result": result, "executions": 0})
        row["executions"] += 1
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, sort_keys=True))
        os.replace(tmp, path)  # a reader never sees half a file
        first = row["result"]
    delay = float(os.environ.get("RUNROW_DEMO_TOOL_DELAY", "0") or 0)
    if delay > 0:
        time.sleep(delay)
    return first


@tool(description="List the files under a directory of the workspace.", input_schema=PATH_ONLY, effect="pure")
def list_files(path: str, idempotency_key: str) -> str:
    base = _inside(path)
    names = sorted(str(p.relative_to(workspace())) for p in base.rglob("*") if p.is_file())
    _record("list_files", idempotency_key, {"path": path}, names)
    return "\n".join(names)


@tool(description="Read a text file of the workspace.", input_schema=PATH_ONLY, effect="pure")
def read_file(path: str, idempotency_key: str) -> str:
    target = _inside(path)
    if not target.is_file():
        raise ToolError(f"no such file: {path}")
    text = target.read_text()
    _record("read_file", idempotency_key, {"path": path}, text)
    return text


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
    # The mail service dedups on the key: a resumed attempt that sends again gets the first
    # message id back and no second email goes out.
    message_id = f"<{idempotency_key[:16]}@mail.example.com>"
    sent = _record("send_email", idempotency_key, {"to": to, "subject": subject, "body": body}, message_id)
    return {"sent": True, "to": to, "message_id": sent}


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
    _record("write_file", idempotency_key, {"path": path}, len(content))
    return f"wrote {len(content)} characters to {path}"


@tool(
    description="Delete a file of the workspace. Irreversible: a person approves it first.",
    input_schema=PATH_ONLY,
    effect="irreversible",
)
def delete_file(path: str, idempotency_key: str) -> str:
    target = _inside(path)
    if not target.is_file():
        raise ToolError(f"no such file: {path}")
    target.unlink()
    _record("delete_file", idempotency_key, {"path": path}, True)
    return f"deleted {path}"


def definitions(names: Iterable[str] = NAMES) -> list[dict[str, Any]]:
    """The Messages API definitions of these tools (by default the demo's, pinned on its run)."""
    mine = module_registries[__name__]
    out = []
    for name in names:
        t = mine.get(name)
        assert t is not None, name
        out.append(t.definition())
    return out


def effects() -> dict[str, str]:
    """Tool name -> effect class."""
    return {name: t.effect for name, t in module_registries[__name__].tools.items()}


def records(root: Path | None = None) -> list[Record]:
    """The downstream record under `root` (default: the demo folder); empty before any tool ran."""
    with _locked_record(root or demo_dir()) as (_, rows):
        return [Record(key, r["tool"], r["args"], r["executions"]) for key, r in rows.items()]


def execution_counts(root: Path | None = None) -> Counter[str]:
    """Tool name -> how often its body ran (every key, every execution)."""
    counts: Counter[str] = Counter()
    for e in records(root):
        counts[e.tool] += e.executions
    return counts
