"""`runrow fork` and `runrow replay`: a recorded run as the start of another, or as an evaluation set.

replay re-asks each model turn of a finished run with the history it had at that point, rebuilt
from the step log (conversation_history): the recorded tool results are served from the log, so
no tool executes, whatever the other model asks for. What changes is only what the flags say: the
model, the system prompt. Thinking blocks are signed for the model, system prompt and tools that
produced them; when the model or the prompt changes they are left out of the request, and where
the API insists on them (thinking on, a tool loop in progress) that request goes without thinking.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from pyworker.agent.history import build_messages
from pyworker.cli.client import CliError, _command, _connect
from pyworker.cli.messages import read_text_option
from pyworker.cli.types import int32, number, sdk_retries_problem
from pyworker.cli.worker_env import model_api_problem
from pyworker.db import forks
from pyworker.db import steps as steps_api
from pyworker.db.config import database_url
from pyworker.db.terminal_text import for_stream

TERMINAL = ("completed", "failed", "cancelled", "dead")
THINKING_TYPES = ("thinking", "redacted_thinking")

if TYPE_CHECKING:
    import anthropic
# The SDK (pyworker.agent.model imports it) is imported by replay itself, not with the module:
# importing anthropic takes about 1.7 s, which every `runrow` command paid, `--help` included,
# because the CLI builds its parser from this module.


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _command(
        sub,
        "fork",
        cmd_fork,
        help="start a new conversation from a run's history up to one of its steps",
        description="runrow.fork_run: a new conversation whose history is the run's (earlier turns "
        "included) up to and including step AT_SEQ (agent_step.seq; 0 = the user message only), "
        "copied byte for byte, and a queued run that continues from there. Prints the new run id; "
        "with --model, also the thinking blocks a request under that model must leave out.",
        epilog="example:\n  runrow fork 5f0c...a2 3 | xargs runrow tail",
    )
    p.add_argument("run", type=uuid.UUID, help="run id to fork")
    p.add_argument("at_seq", type=int32, help="the last step to copy (agent_step.seq of the run)")
    p.add_argument("--model", help="pin the fork to another model (default: the run's)")

    p = _command(
        sub,
        "replay",
        cmd_replay,
        help="re-ask a finished run's model turns (another model or prompt); no tool executes",
        description="For each model turn of the run, send the history it had then (tool results "
        "as recorded in the step log) to --model with --system-file's prompt, and print the "
        "recorded answer and the new one side by side with their token counts. Nothing is "
        "written to the database and no tool runs. Needs ANTHROPIC_API_KEY, or ANTHROPIC_BASE_URL "
        "(a gateway, `runrow fake-model`), as `runrow worker` does: without either it does nothing.",
        epilog="examples:\n  runrow replay 5f0c...a2 --model claude-haiku-4-5\n"
        "  runrow replay 5f0c...a2 --system-file prompts/v2.txt\n"
        "  ANTHROPIC_BASE_URL=http://127.0.0.1:8765 runrow replay 5f0c...a2   # against `runrow fake-model`",
    )
    p.add_argument("run", type=uuid.UUID, help="run id of a finished run")
    p.add_argument("--model", help="model to ask (default: the run's)")
    p.add_argument(
        "--system-file", type=Path, metavar="FILE", help="system prompt to use instead of the run's"
    )
    p.add_argument(
        "--width", type=number(int, 0, 10000), default=0, help="total width (default: the terminal's)"
    )


async def cmd_fork(args: argparse.Namespace) -> int:
    async with await _connect(database_url(args.database_url)) as conn:
        fork = await forks.fork_run(conn, args.run, args.at_seq, args.model)
    print(fork.new_run_id)
    if fork.must_drop:
        print(json.dumps({"must_drop": fork.must_drop}))
    return 0


@dataclass
class Answer:
    model: str
    text: str
    tool_calls: list[str]
    input_tokens: int | None
    output_tokens: int | None
    note: str = ""


async def cmd_replay(args: argparse.Namespace) -> int:
    system_override: str | None = None
    if args.system_file is not None:
        try:
            system_override = read_text_option(args.system_file, "--system-file")
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if args.model is not None and not args.model.strip():
        raise CliError("--model must not be empty")
    problem = sdk_retries_problem() or model_api_problem("replay", "every turn it re-asks would fail")
    if problem is not None:
        raise CliError(problem)
    async with await _connect(database_url(args.database_url)) as conn:
        try:
            request = await forks.get_run_request(conn, args.run)
        except psycopg.errors.NoDataFound as exc:
            raise CliError(f"run {args.run} does not exist") from exc
        if request.status not in TERMINAL:
            raise CliError(f"run {args.run} is {request.status}: replay needs a finished run")
        rows = await steps_api.conversation_history(conn, request.conversation_id, args.run)
        usages = {
            r.seq: (await steps_api.get_step(conn, args.run, r.seq)).usage
            for r in rows
            if r.run_id == args.run and r.kind == "model_turn" and r.seq is not None
        }
    model = args.model or request.model
    system = request.system_prompt if system_override is None else system_override
    changed = model != request.model or system != request.system_prompt
    from pyworker.agent.model import client_for

    client = client_for({})
    pairs: list[tuple[int, Answer, Answer]] = []
    for i, row in enumerate(rows):
        if row.run_id != args.run or row.kind != "model_turn" or row.seq is None:
            continue
        recorded_usage = usages.get(row.seq) or {}
        recorded = _answer(request.model, json.loads(row.payload), recorded_usage)
        params = _params(request, model, system, build_messages(rows[:i]), drop_thinking=changed)
        pairs.append((row.seq, recorded, await _ask(client, params)))
    if not pairs:
        raise CliError(f"run {args.run} has no model turn to replay")
    _print(args, request.model, model, system_override is not None, pairs)
    return 1 if any(new.note.startswith("error") for _, _, new in pairs) else 0


def _params(
    request: forks.RunRequest,
    model: str,
    system: str | None,
    messages: list[dict[str, Any]],
    *,
    drop_thinking: bool,
) -> dict[str, Any]:
    from pyworker.agent.model import DEFAULT_MAX_TOKENS, REQUEST_PARAMS

    meta = request.metadata or {}
    params: dict[str, Any] = {"model": model, "max_tokens": DEFAULT_MAX_TOKENS}
    params.update({name: meta[name] for name in REQUEST_PARAMS if meta.get(name) is not None})
    if drop_thinking:
        messages = [_without_thinking(m) for m in messages]
        if params.get("thinking") and _tool_loop_without_thinking(messages):
            # The API refuses a tool loop whose assistant turn lost its thinking while thinking is
            # on; the recorded thinking cannot be sent under another model or prompt.
            params.pop("thinking")
            params["_note"] = "thinking off: the recorded thinking is signed for another model or prompt"
    params["messages"] = messages
    if system:
        params["system"] = system
    if request.tools:
        params["tools"] = request.tools
    return params


def _without_thinking(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if message["role"] != "assistant" or not isinstance(content, list):
        return message
    return {**message, "content": [b for b in content if b.get("type") not in THINKING_TYPES]}


def _tool_loop_without_thinking(messages: list[dict[str, Any]]) -> bool:
    if len(messages) < 2 or not isinstance(messages[-1]["content"], list):
        return False
    if not any(b.get("type") == "tool_result" for b in messages[-1]["content"]):
        return False
    previous = messages[-2]["content"]
    return not (isinstance(previous, list) and previous and previous[0].get("type") in THINKING_TYPES)


async def _ask(client: anthropic.AsyncAnthropic, params: dict[str, Any]) -> Answer:
    import anthropic

    note = params.pop("_note", "")
    try:
        message = (await client.messages.create(**params)).to_dict(mode="json")
    except anthropic.APIStatusError as exc:
        return Answer(params["model"], "", [], None, None, f"error: HTTP {exc.status_code}: {exc.message}")
    except anthropic.APIConnectionError as exc:
        return Answer(params["model"], "", [], None, None, f"error: model API unreachable: {exc}")
    answer = _answer(params["model"], message.get("content") or [], message.get("usage") or {})
    answer.note = note
    return answer


def _answer(model: str, content: list[Any], usage: dict[str, Any]) -> Answer:
    text = "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    calls = [
        f"-> {b.get('name')} {json.dumps(b.get('input'), ensure_ascii=False)}"
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    return Answer(model, text, calls, usage.get("input_tokens"), usage.get("output_tokens"))


def _print(
    args: argparse.Namespace,
    recorded_model: str,
    model: str,
    new_system: bool,
    pairs: list[tuple[int, Answer, Answer]],
) -> None:
    width = args.width or shutil.get_terminal_size((120, 24)).columns
    column = max(20, (width - 3) // 2)
    prompt = "system prompt from " + str(args.system_file) if new_system else "recorded system prompt"
    print(f"replay of run {args.run}: {len(pairs)} model turns; tool results from the step log, none ran")
    print(_shown(f"recorded: {recorded_model}    replay: {model}, {prompt}"))
    totals = {"recorded": [0, 0], "replay": [0, 0]}
    for seq, recorded, new in pairs:
        print()
        print(f"== step {seq} ".ljust(2 * column + 3, "="))
        left, right = _lines(recorded, column), _lines(new, column)
        left += [""] * (len(right) - len(left))
        right += [""] * (len(left) - len(right))
        for a, b in zip(left, right, strict=True):
            print(f"{a.ljust(column)} | {b}".rstrip())
        for key, answer in (("recorded", recorded), ("replay", new)):
            totals[key][0] += answer.input_tokens or 0
            totals[key][1] += answer.output_tokens or 0
    print()
    print("== total ".ljust(2 * column + 3, "="))
    left = f"recorded  in {totals['recorded'][0]}  out {totals['recorded'][1]}"
    right = f"replay  in {totals['replay'][0]}  out {totals['replay'][1]}"
    print(f"{left.ljust(column)} | {right}")


def _lines(answer: Answer, column: int) -> list[str]:
    """One side of a step, wrapped to `column`. The text is the model's (and an error the API's),
    so it is shown as for_stream writes it before it is measured: `\\e]0;PWNED\\a` retitled
    the terminal, and its bytes, drawn as nothing, threw the other column out of line."""
    tokens = f"in {_n(answer.input_tokens)}  out {_n(answer.output_tokens)}"
    lines = [_shown(f"{answer.model}  {tokens}")[:column]]
    if answer.note:
        lines += textwrap.wrap(_shown(f"({answer.note})"), column)
    for paragraph in answer.text.splitlines() or ([""] if not answer.tool_calls else []):
        lines += textwrap.wrap(_shown(paragraph), column) or [""]
    for call in answer.tool_calls:
        lines += textwrap.wrap(_shown(call), column)
    return lines


def _shown(text: str) -> str:
    return for_stream(text, sys.stdout)


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)
