"""The demo agent's tools: a tool module as a user writes one (`runrow worker --tools examples.tools_demo`).

Each tool is a plain function registered with `@tool`, which declares its name, its input JSON
schema and its effect class. The tools work on a workspace directory ($RUNROW_DEMO_WORKSPACE,
default ./demo-workspace) and record every execution in `effects.sqlite` there, the way a
downstream service would:

- `effects` (idempotency_key PRIMARY KEY, tool, args, executions): one row per effect that took
  place downstream (the key dedups it: a repeated call with the same key is not a second email),
  and `executions` counts how often the tool body actually ran with that key.

`send_email` is the non-idempotent one: every call with a *new* key sends one more email, so it
passes its idempotency key to the "mail service", which keeps the first result for a key.
$RUNROW_DEMO_TOOL_DELAY (seconds, default 0) is the time each tool takes after its effect,
which gives a crash test a window in which the effect happened but its result is not recorded.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from pyworker.tools import ToolError, tool

PATH_ONLY = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

SEED_FILES = {
    "notes/todo.txt": "- ship the durable agent runs\n- write the status email\n",
    "notes/contacts.txt": "team: team@example.com\n",
}


def workspace() -> Path:
    root = Path(os.environ.get("RUNROW_DEMO_WORKSPACE", "demo-workspace")).resolve()
    if not (root / "notes").exists():
        seed_workspace(root)
    return root


def seed_workspace(root: Path) -> None:
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


def _record(tool_name: str, key: str, args: dict[str, Any], result: Any) -> Any:
    """The downstream service: the first result for a key wins; every execution is counted."""
    db = sqlite3.connect(workspace() / "effects.sqlite", timeout=30, isolation_level=None)
    try:
        db.execute(
            "CREATE TABLE IF NOT EXISTS effects (idempotency_key TEXT PRIMARY KEY, tool TEXT NOT NULL, "
            "args TEXT NOT NULL, result TEXT NOT NULL, executions INTEGER NOT NULL)"
        )
        db.execute(
            "INSERT INTO effects VALUES (?, ?, ?, ?, 1) ON CONFLICT (idempotency_key) "
            "DO UPDATE SET executions = executions + 1",
            (key, tool_name, json.dumps(args, sort_keys=True), json.dumps(result)),
        )
        (first,) = db.execute("SELECT result FROM effects WHERE idempotency_key = ?", (key,)).fetchone()
        return json.loads(first)
    finally:
        db.close()


def _latency() -> None:
    delay = float(os.environ.get("RUNROW_DEMO_TOOL_DELAY", "0") or 0)
    if delay:
        time.sleep(delay)


@tool(description="List the files under a directory of the workspace.", input_schema=PATH_ONLY, effect="pure")
def list_files(path: str, idempotency_key: str) -> list[str] | str:
    base = _inside(path)
    names = sorted(
        str(p.relative_to(workspace())) for p in base.rglob("*") if p.is_file() and ".sqlite" not in p.name
    )
    _record("list_files", idempotency_key, {"path": path}, names)
    _latency()
    return "\n".join(names)


@tool(description="Read a text file of the workspace.", input_schema=PATH_ONLY, effect="pure")
def read_file(path: str, idempotency_key: str) -> str:
    target = _inside(path)
    if not target.is_file():
        raise ToolError(f"no such file: {path}")
    text = target.read_text()
    _record("read_file", idempotency_key, {"path": path}, text)
    _latency()
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
    _latency()
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
    _latency()
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
    _latency()
    return f"deleted {path}"


def effect_counts(root: Path) -> dict[str, dict[str, int]]:
    """Per tool: `effects` (distinct keys downstream) and `executions` (times the body ran)."""
    db = sqlite3.connect(root / "effects.sqlite", timeout=30)
    try:
        rows = db.execute(
            "SELECT tool, count(*), sum(executions) FROM effects GROUP BY tool ORDER BY tool"
        ).fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()
    return {name: {"effects": n, "executions": int(runs)} for name, n, runs in rows}
