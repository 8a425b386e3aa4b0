"""`runrow demo`: a durable agent run survives a SIGKILL of its worker, live, with nothing redone.

What it starts (and always shuts down again, also on Ctrl-C or an error):
1. a throwaway PostgreSQL 15 cluster (or the database of --database-url / DATABASE_URL), migrated;
2. the fake Anthropic Messages API in this process (scenario `demo`), or the real API when
   ANTHROPIC_API_KEY is set (unless --fake);
3. two `runrow worker` processes (worker-a, worker-b) with the demo tools (pyworker/demo/tools.py),
   2 s leases, a 1 s reap grace;
4. one agent run: a multi-step tool task (list_files, read_file x2, send_email, write_file,
   read_file, summary), pinned model + system prompt + tools, thinking on, max_attempts 3.

Then it follows the run's journal (`pyworker.db.tail`, runrow.read_events): model text and thinking
as they stream, one line per structural event. Once step N (--kill-after-step) is committed it
SIGKILLs whichever worker holds the run; the lease lapses, a reaper requeues the run and the other
worker claims it (attempt 2), rebuilds the request from the step log and continues at the next
step. At the end it prints how often each tool body ran (send_email, the non-idempotent one, must
have run exactly once), the step log and the journal by type, read back through runrow.* functions.
Exit 0 only when the run completed and send_email ran exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyworker.db import api, devdb
from pyworker.db import steps as steps_api
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.config import env_database_url
from pyworker.db.hub import Hub
from pyworker.db.ids import uuid7
from pyworker.db.migrate import migrate
from pyworker.db.pooling import POOLER_SAFE
from pyworker.db.tail import Keepalive, tail
from pyworker.demo.render import EventPrinter, Screen, short, table

REAL_MODEL = "claude-sonnet-4-5"
FAKE_MODEL = "claude-fake-demo"
WORKERS = ("worker-a", "worker-b")
LEASE, GRACE, POLL, REAP_INTERVAL = 2, 1, 0.5, 0.5
SYSTEM = (
    "You are a careful assistant with tools over a small workspace. Work step by step and call one "
    "kind of tool per turn. Send the email exactly once."
)
TASK = (
    "List the workspace, read notes/todo.txt and notes/contacts.txt, email the team (the address is in "
    "the contacts) a short weekly status, write report.md saying the email was sent, read report.md "
    "back to check it, then summarise what you did in two sentences."
)
METADATA = {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 1024}}
NON_IDEMPOTENT = "send_email"
WORKER_STOPS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class Options:
    database_url: str | None = None
    fake: bool = False
    model: str | None = None
    delta_delay: float = 0.015
    tool_delay: float = 0.3
    kill_after_step: int = 3
    timeout: float = 120.0
    keep: bool = False


@dataclass
class Live:
    """What the demo saw while following the run."""

    run_id: uuid.UUID | None = None
    conversation_id: uuid.UUID | None = None
    complete: dict[str, Any] | None = None
    claims: list[tuple[int, str]] = field(default_factory=list)  # (attempt, worker)
    killed: tuple[str, int, int] | None = None  # (worker, pid, last committed step)
    resumed_at: int | None = None  # steps already in the log when attempt 2 claimed


class WorkerProcess:
    """A `runrow worker` subprocess with its log in a file (the terminal shows the journal instead)."""

    def __init__(self, name: str, env: dict[str, str], workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.killed = False
        self.terminated = False
        cmd = [
            sys.executable, "-m", "pyworker", "worker",
            "--handler", "pyworker.agent:handle", "--tools", "pyworker.demo.tools",
            "--worker-id", name, "--concurrency", "1", "--lease", str(LEASE), "--grace", str(GRACE),
            "--poll", str(POLL), "--reap-interval", str(REAP_INTERVAL), "--drain", "5",
        ]  # fmt: skip
        # Own process group: a Ctrl-C in the terminal reaches only the demo, which stops the workers
        # in order. setpriv's parent-death signal ends them even if the demo itself is SIGKILLed.
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "TERM", "--", *cmd]
        # Started with SIGTERM and SIGINT blocked (a child inherits the mask): a stop that comes
        # while it still imports waits, pending, until `runrow worker` handles it
        # (pyworker/worker/early_signals.py); before, it died by the signal (exit -15).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_STOPS)
        try:
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def started(self) -> bool:
        if self.proc.poll() is not None:
            raise DemoError(f"{self.name} exited with status {self.proc.returncode}:\n{self.log()[-3000:]}")
        return f"worker {self.name} started" in self.log()

    def kill(self) -> None:
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> None:
        # Once only: a second SIGTERM means "exit now" to a draining worker.
        if not self.terminated and self.proc.poll() is None:
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)  # drain: nothing in flight, so it exits at once

    def stop(self) -> str:
        if self.killed:
            return "killed by the demo (SIGKILL)"
        if self.proc.returncode is not None:
            return f"had exited ({self.proc.returncode})"
        self.terminate()
        try:
            return f"stopped (SIGTERM, exit {self.proc.wait(timeout=10)})"
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return "did not drain in 10 s: killed"


class DemoError(RuntimeError):
    pass


def run(opts: Options, screen: Screen | None = None) -> int:
    # Imported here, not at the top: importing it registers the demo's tools, and every
    # `runrow` process imports this module to build its parser.
    from pyworker.demo import tools as demo_tools

    screen = screen or Screen()
    real = bool(os.environ.get("ANTHROPIC_API_KEY")) and not opts.fake
    # The terminal shows the journal; the library's own INFO lines (migrate, hub) would only clutter it.
    logging.getLogger("runrow").setLevel(logging.WARNING)
    screen.heading("runrow demo: a durable agent run survives a killed worker")
    screen.line(
        "An agent run is a row in PostgreSQL. Two workers compete for it; the demo kills the one", stamp=False
    )
    screen.line(
        "running it mid-run. The other resumes from the step log, and the non-idempotent tool", stamp=False
    )
    screen.line("(send_email) still runs exactly once.", stamp=False)
    stack = contextlib.ExitStack()
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    code = 1
    try:
        with stack:
            workdir = Path(tempfile.mkdtemp(prefix="runrow-demo-"))
            if not opts.keep:
                # A SIGKILL of the demo reaches no `finally`: the cluster's reaper removed the
                # cluster, and this folder (worker logs, workspace) stayed in /tmp. Registered
                # first, so it is dismissed last, once the folder is gone.
                stack.callback(devdb.reap_folder_if_owner_dies(str(workdir)))
                stack.callback(shutil.rmtree, workdir, True)
            try:
                demo_tools.seed(workdir / "workspace")
                url = _database(opts, screen, stack)
                env, model_name, fake = _model(opts, real, screen, stack, workdir)
                env["DATABASE_URL"] = url
                workers = _workers(env, workdir, screen, stack)
                live = asyncio.run(_follow(url, opts, model_name, workers, screen))
                code = _report(url, live, workers, fake, workdir, opts, screen)
            except (DemoError, devdb.DevDbError) as exc:
                screen.line(f"demo failed: {exc}", "bold", "red")
            except KeyboardInterrupt as exc:
                screen.line(f"interrupted ({_signal_name(exc)})", "yellow")
                code = _interrupted(exc)
            screen.heading("Shutting down everything the demo started")
        if opts.keep:
            screen.line(f"kept {workdir} (worker logs, workspace, effects.json)", stamp=False)
    except KeyboardInterrupt as exc:
        screen.line(f"interrupted again while shutting down ({_signal_name(exc)})", "yellow")
        return _interrupted(exc)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    verdict = "OK" if code == 0 else "INTERRUPTED" if code > 128 else "FAILED"
    screen.line(f"{verdict}: demo took {time.monotonic() - screen.started:.1f} s", "bold")
    return code


class _Signalled(KeyboardInterrupt):
    """SIGTERM, raised where the demo is, so it shuts down as on Ctrl-C (and exits 143, not 130)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise _Signalled(signum)


def _interrupted(exc: KeyboardInterrupt) -> int:
    """128 + the signal, as a shell reports a process the signal ended: 130 Ctrl-C, 143 SIGTERM."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _signal_name(exc: KeyboardInterrupt) -> str:
    return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name


def _database(opts: Options, screen: Screen, stack: contextlib.ExitStack) -> str:
    screen.heading("Database")
    url = opts.database_url or env_database_url()
    if url:
        screen.line("using the database of --database-url / DATABASE_URL")
        screen.note("note: the demo's workers claim any queued run in that database")
    else:
        screen.line("starting a throwaway PostgreSQL 15 cluster (Unix socket, own temp folder) ...")
        cluster = stack.enter_context(devdb.throwaway())
        stack.callback(screen.line, "PostgreSQL cluster stopped and its folder removed")
        url = cluster.url
        screen.line(f"cluster up in {cluster.root}")
    result = migrate(url)
    screen.line(
        f"runrow migrate: schema {result.version}, {len(result.applied)} migrations applied, "
        f"{len(result.functions)} functions (re)applied"
    )
    return url


def _model(
    opts: Options, real: bool, screen: Screen, stack: contextlib.ExitStack, workdir: Path
) -> tuple[dict[str, str], str, Any]:
    screen.heading("Model")
    env = dict(
        os.environ,
        RUNROW_DEMO_DIR=str(workdir),
        RUNROW_DEMO_TOOL_DELAY=str(opts.tool_delay),
        RUNROW_LOG_FORMAT="text",
    )
    env.pop("RUNROW_TOOLS", None)
    if real:
        model = opts.model or REAL_MODEL
        where = os.environ.get("ANTHROPIC_BASE_URL") or "the real Messages API"
        screen.line(f"ANTHROPIC_API_KEY is set: {where}, model {model}")
        screen.note("the real model decides its own steps; the kill still lands after step "
                    f"{opts.kill_after_step}")  # fmt: skip
        return env, model, None
    from pyworker.fake.server import FakeModel

    fake = FakeModel("demo", delta_delay=opts.delta_delay)
    fake.start()
    stack.callback(screen.line, "fake model stopped")
    stack.callback(fake.stop)
    env.update(ANTHROPIC_BASE_URL=fake.base_url, ANTHROPIC_API_KEY="demo-key-for-the-fake-model")
    screen.line(
        f"fake Anthropic Messages API on {fake.base_url} (scenario demo, {opts.delta_delay}s per event)"
    )
    screen.note("set ANTHROPIC_API_KEY to run the same demo against the real API")
    return env, opts.model or FAKE_MODEL, fake


def _workers(
    env: dict[str, str], workdir: Path, screen: Screen, stack: contextlib.ExitStack
) -> dict[str, WorkerProcess]:
    screen.heading("Workers")
    workers: dict[str, WorkerProcess] = {}

    def stop_all() -> None:
        for w in workers.values():
            w.terminate()
        for w in workers.values():
            screen.line(f"{w.name}: {w.stop()}")

    stack.callback(stop_all)
    for name in WORKERS:
        workers[name] = WorkerProcess(name, env, workdir)
        screen.line(f"{name} starting (pid {workers[name].pid}) ...")
    deadline = time.monotonic() + 60
    while not all(w.started() for w in workers.values()):
        if time.monotonic() > deadline:
            raise DemoError("the workers did not start within 60 s")
        time.sleep(0.05)
    for w in workers.values():
        screen.line(
            f"{w.name} up (pid {w.pid}): runrow worker --tools pyworker.demo.tools --lease {LEASE} "
            f"--grace {GRACE}"
        )
    screen.note(f"worker logs: {workdir}/worker-*.log (removed at the end unless --keep)")
    return workers


async def _follow(
    url: str, opts: Options, model: str, workers: dict[str, WorkerProcess], screen: Screen
) -> Live:
    from pyworker.demo import tools as demo_tools

    live = Live()
    pool = CancelSafePool(url, min_size=1, max_size=4, kwargs={"autocommit": True, **POOLER_SAFE}, open=False)
    await pool.open(wait=True, timeout=30)
    hub = Hub(url, application_name="runrow-demo")
    try:
        await hub.start()
        await hub.wait_connected(5)
        screen.heading("The run, live from its journal")
        live.conversation_id = uuid7()
        async with pool.connection() as conn:
            enqueued = await api.enqueue_run(
                conn,
                live.conversation_id,
                TASK,
                model,
                system_prompt=SYSTEM,
                tools=demo_tools.definitions(),
                max_attempts=3,
                metadata=METADATA,
            )
        live.run_id = enqueued.run_id
        screen.line(f"enqueue_run: run {live.run_id}, tools {', '.join(demo_tools.NAMES)}, max_attempts 3")
        screen.note(f"task: {TASK}")
        printer = EventPrinter(screen, {name: w.pid for name, w in workers.items()})
        async with asyncio.timeout(opts.timeout):
            async with contextlib.aclosing(tail(pool, hub, live.run_id)) as items:
                async for item in items:
                    if isinstance(item, Keepalive):
                        continue
                    printer.show(item)
                    await _react(item, live, opts, workers, pool, screen)
                    if item.type == "complete":
                        live.complete = item.payload
    except TimeoutError:
        raise DemoError(f"the run did not finish within {opts.timeout:.0f} s") from None
    finally:
        await hub.stop()
        await pool.close()
    return live


async def _react(
    event: api.Event, live: Live, opts: Options, workers: dict[str, WorkerProcess], pool: Any, screen: Screen
) -> None:
    p = event.payload
    if event.type == "run_claimed":
        live.claims.append((int(p["attempt"]), str(p["worker_id"])))
        if live.killed is not None and live.resumed_at is None:
            assert live.conversation_id is not None and live.run_id is not None
            async with pool.connection() as conn:
                rows = await steps_api.conversation_history(conn, live.conversation_id, live.run_id)
            live.resumed_at = sum(1 for r in rows if r.run_id == live.run_id and r.source == "step")
            k = live.resumed_at
            screen.line(
                f"RESUME: {p['worker_id']} rebuilt the request from conversation_history: steps 1..{k} "
                f"are in the log, so it continues at step {k + 1}",
                "bold",
                "blue",
            )
            screen.note("nothing committed is done again: the model is not asked for those turns again,")
            screen.note("and tools with a recorded result are not run again")
        return
    step = p.get("step_seq") if event.type in ("model_turn", "tool_result") else None
    if (
        step is None
        or live.killed is not None
        or opts.kill_after_step <= 0
        or step < opts.kill_after_step
        or not live.claims
    ):
        return
    holder = workers.get(live.claims[-1][1])
    if holder is None:
        return
    holder.kill()
    live.killed = (holder.name, holder.pid, int(step))
    screen.line(
        f"KILL: step {step} is committed: SIGKILL {holder.name} (pid {holder.pid}), which holds the run",
        "bold",
        "red",
    )
    screen.note("whatever it was doing after that commit is lost; its claim stays until the lease runs out:")
    screen.note(
        f"lease {LEASE} s + grace {GRACE} s, then a reaper (on the surviving worker) requeues the run"
    )
    screen.note(
        f"lines labelled {holder.name} #{live.claims[-1][0]} below were journaled before the kill: the "
        "demo prints each event as it reads it"
    )


def _report(
    url: str,
    live: Live,
    workers: dict[str, WorkerProcess],
    fake: Any,
    workdir: Path,
    opts: Options,
    screen: Screen,
) -> int:
    from pyworker.demo import tools as demo_tools

    summary = asyncio.run(_read_back(url, live))
    events, steps = summary
    complete = live.complete or {}
    status = complete.get("status")

    screen.heading("Who ran it")
    attempt_of, request_of = _step_origins(events)
    for n, (attempt, worker) in enumerate(live.claims):
        w = workers.get(worker)
        mine = sorted(seq for seq, a in attempt_of.items() if a == attempt)
        line = f"attempt {attempt}: {worker}" + (f" (pid {w.pid})" if w else "")
        line += f" committed steps {mine[0]}..{mine[-1]}" if mine else " committed no step"
        if w is not None and w.killed and n < len(live.claims) - 1:
            line += ", then was SIGKILLed"
        elif n == len(live.claims) - 1:
            line += f" and ended the run ({status})"
        screen.line(line, stamp=False)
    if opts.kill_after_step > 0 and live.killed is None:
        screen.line(
            f"(the run ended before step {opts.kill_after_step}: no kill happened)", "yellow", stamp=False
        )

    screen.heading("Side effects, counted by the tools themselves")
    counts = demo_tools.execution_counts(workdir)
    effects = demo_tools.effects()
    rows = []
    for name in demo_tools.NAMES:
        why = {
            "pure": "a pure tool may run again after a crash",
            "idempotent": "safe to repeat",
            "non_idempotent": "must run exactly once",
        }.get(effects.get(name, ""), "")
        rows.append((name, effects.get(name, "?"), counts.get(name, 0), why))
    table(screen, ("tool", "effect", "executions", ""), rows)
    emails = counts.get(NON_IDEMPOTENT, 0)
    screen.line("", stamp=False)
    screen.line(
        f"effect count of {NON_IDEMPOTENT} (non-idempotent): {emails}",
        "bold",
        "green" if emails == 1 else "red",
        stamp=False,
    )

    screen.heading("Step log, read back with runrow.conversation_history")
    step_rows = []
    for r in steps:
        step_rows.append((r.seq, r.kind, attempt_of.get(r.seq, "?"), request_of.get(r.seq) or "", _detail(r)))
    table(screen, ("seq", "kind", "attempt", "request_id", "content"), step_rows)
    if fake is not None:
        asked = Counter(_model_step(req.body) for req in fake.requests if req.path.startswith("/v1/messages"))
        repeated = sum(n - 1 for n in asked.values() if n > 1)
        turns = sum(1 for r in steps if r.kind == "model_turn")
        screen.line("", stamp=False)
        screen.line(
            f"model calls: {sum(asked.values())} for {turns} committed model turns"
            + (
                f" ({repeated} repeated: a turn cut off by the kill mid-stream)"
                if repeated
                else " (none repeated)"
            ),
            stamp=False,
        )

    screen.heading(f"Journal, read back with runrow.read_events: {len(events)} rows")
    by_type = Counter(e.type for e in events)
    table(screen, ("type", "rows"), sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0])))
    screen.note("text/thinking/input deltas are coalesced: one row per 250 ms flush, not per token")

    screen.heading("Result")
    result = complete.get("result") or {}
    screen.line(
        f"status: {status}" + (f", error: {complete.get('error')}" if complete.get("error") else ""),
        stamp=False,
    )
    text = str(result.get("text") or "").strip()
    if text:
        screen.line(f"answer: {text}", stamp=False)
    ok = status == "completed" and emails == 1
    if ok:
        screen.line(
            "the run completed and the non-idempotent effect happened exactly once",
            "bold",
            "green",
            stamp=False,
        )
    else:
        screen.line(
            "NOT OK: the run must complete with send_email executed exactly once", "bold", "red", stamp=False
        )
        for w in workers.values():
            screen.line(f"--- last lines of {w.name}.log ---", stamp=False)
            screen.line(w.log()[-2000:], stamp=False)
    return 0 if ok else 1


async def _read_back(url: str, live: Live) -> tuple[list[api.Event], list[steps_api.HistoryRow]]:
    """The whole journal and this run's steps, through runrow.read_events / conversation_history."""
    assert live.run_id is not None and live.conversation_id is not None
    events: list[api.Event] = []
    async with await _connect(url) as conn:
        while True:
            page = await api.read_events(conn, live.run_id, events[-1].seq if events else 0, 500)
            events.extend(page)
            # After a complete, a read would only synthesize the ending again.
            if len(page) < 500 or page[-1].type == "complete":
                break
        rows = await steps_api.conversation_history(conn, live.conversation_id, live.run_id)
    return events, [r for r in rows if r.run_id == live.run_id and r.source == "step"]


async def _connect(url: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(url, autocommit=True, **POOLER_SAFE)


def _step_origins(events: list[api.Event]) -> tuple[dict[int, int], dict[int, str | None]]:
    """Step seq -> the attempt that committed it, and -> its request id (model turns)."""
    attempt, attempt_of, request_of = 0, {}, {}
    for e in events:
        if e.type == "run_claimed":
            attempt = int(e.payload.get("attempt") or 0)
        seq = e.payload.get("step_seq")
        if e.type in ("model_turn", "tool_result") and isinstance(seq, int):
            attempt_of[seq] = attempt
            if e.type == "model_turn":
                request_of[seq] = e.payload.get("request_id")
    return attempt_of, request_of


def _detail(row: steps_api.HistoryRow) -> str:
    import json

    payload = json.loads(row.payload)
    if row.kind == "model_turn" and isinstance(payload, list):
        parts = []
        for block in payload:
            kind = block.get("type")
            if kind == "tool_use":
                parts.append(f"tool_use {block.get('name')}")
            elif kind == "text":
                parts.append(f"text {short(block.get('text'), 30)!r}")
            elif kind in ("thinking", "redacted_thinking"):
                parts.append(kind + (" (signed)" if block.get("signature") or block.get("data") else ""))
        return ", ".join(parts)
    if isinstance(payload, dict):
        content = payload.get("content")
        return ("is_error: " if payload.get("is_error") else "") + short(str(content).replace("\n", " "), 40)
    return short(row.payload, 40)


def _model_step(body: Any) -> int:
    from pyworker.fake.scenarios import conversation_step

    return conversation_step((body or {}).get("messages") or []) if isinstance(body, dict) else -1
