"""Chaos: real `runrow worker` processes under random SIGKILL, SIGSTOP+SIGCONT and SIGTERM with
restarts, hundreds of echo runs across conversations of several turns, short leases so the
reaper takes over, and then the checks that must hold whatever happened:

- none lost: every enqueued run exists (and nothing else does), and every run is terminal;
- its journal's seqs are exactly 1..n, it has exactly one `complete` event, and that is the last
  event and carries the run's status;
- the final attempt's journal text (the text_delta events after the last `run_claimed`; text an
  earlier attempt streamed, superseded or not, lies before it) equals the run's result text, and
  a completed run's text is the whole echo;
- turn order per conversation: turns end in the order they were enqueued, and, sampled all along,
  no conversation ever has two active turns or a turn running ahead of an earlier queued one;
- `runrow.audit()` returns no row.

    python tests/chaos.py --duration 180 --workers 4 --runs 400 --seed 7   # make chaos
    python tests/chaos.py --help

The fault schedule (what happens when, to which worker slot, how long a pause lasts) comes from
`--seed` alone; a fault aimed at a slot that is down or paused at that moment goes to the next
slot that is up (skipped, and counted, when none is). The checks read rows only and use the
database's clock, never this process's. Every process the harness starts is killed before it
returns, also on failure or Ctrl-C. Exit status 0 means no violation. Uses a fresh database of
its own under DATABASE_URL (or --database-url), or a throwaway cluster when neither is given.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from worker_support import WorkerProcess, enqueue_echo

from pyworker.db import devdb

TERMINAL = ("completed", "failed", "cancelled", "dead")
WORDS = "lease fence claim reap wake journal turn stop step resume token heartbeat".split()


@dataclass(frozen=True)
class Settings:
    duration: float = 60.0  # seconds of faults
    workers: int = 4
    runs: int = 300
    turns: int = 4  # per conversation
    seed: int = 1
    lease: int = 2
    grace: int = 1
    max_attempts: int = 10
    settle: float = 120.0  # most seconds to wait, after the faults, for every run to end
    concurrency: int = 4
    drain: float = 1.0
    # Longer than the lease: a frozen worker often wakes up before another worker's reaper has
    # taken its run, and its own reaper takes it (and its dispatcher may claim it straight back).
    reap_interval: float = 4.0


@dataclass
class Summary:
    settings: Settings
    runs: int = 0
    conversations: int = 0
    faults: Counter[str] = field(default_factory=Counter)  # kill, stop, term (done), skipped
    restarts: int = 0
    requeues: Counter[str] = field(default_factory=Counter)  # by the error's kind
    reaps: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    attempts: Counter[int] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    logs: Path | None = None

    def render(self) -> str:
        s = self.settings
        lines = [
            f"chaos: seed {s.seed}, {s.workers} workers (concurrency {s.concurrency}), lease {s.lease} s, "
            f"grace {s.grace} s, {s.duration:.0f} s of faults, {self.seconds:.0f} s in all",
            f"runs: {self.runs} in {self.conversations} conversations; "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())),
            "faults: "
            + ", ".join(f"{k} {self.faults[k]}" for k in ("kill", "stop", "term", "skipped"))
            + f"; worker restarts {self.restarts}",
            f"reaps: {self.reaps}; requeues: "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.requeues.items())) or "none"),
            "attempts: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.attempts.items())),
            f"violations: {len(self.violations)}",
        ]
        lines += [f"  {v}" for v in self.violations[:50]]
        if len(self.violations) > 50:
            lines.append(f"  ... and {len(self.violations) - 50} more")
        if self.logs is not None:
            lines.append(f"worker logs: {self.logs}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str  # kill, stop, term
    slot: int
    pause: float  # stop: how long the process stays stopped; kill/term: delay before the restart


def fault_schedule(s: Settings) -> list[Fault]:
    """Every fault of the run, from the seed alone."""
    rng = random.Random(f"faults-{s.seed}")
    faults, t = [], rng.uniform(1.0, 2.0)
    while t < s.duration:
        kind = rng.choices(["kill", "stop", "term"], weights=[2, 6, 2])[0]
        slot = rng.randrange(s.workers)
        # Pauses shorter and (mostly) longer than lease + grace: the run of a long pause is
        # reaped while its worker is frozen, or by that worker's own reaper as it wakes up.
        longest = s.lease + s.grace + s.reap_interval
        pause = rng.uniform(0.5 * s.lease, longest) if kind == "stop" else rng.uniform(0.1, 1.5)
        faults.append(Fault(t, kind, slot, pause))
        t += rng.uniform(0.3, 1.5)
    return faults


@dataclass(frozen=True)
class Turn:
    conversation: uuid.UUID
    index: int
    text: str
    duration: float


def enqueue_plan(s: Settings) -> list[tuple[float, list[Turn]]]:
    """(when, the turns of one conversation): a conversation's turns are enqueued together, in
    order; conversations arrive over the first 60 % of the fault window."""
    rng = random.Random(f"runs-{s.seed}")
    plan = []
    conversations = -(-s.runs // s.turns)
    made = 0
    for c in range(conversations):
        conv = uuid.UUID(int=rng.getrandbits(128), version=4)
        turns = []
        for i in range(min(s.turns, s.runs - made)):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
            turns.append(Turn(conv, i, f"[c{c} t{i}] {words}", round(rng.uniform(0.3, 3.0), 2)))
            made += 1
        plan.append((rng.uniform(0, 0.6 * s.duration), turns))
    return sorted(plan, key=lambda p: p[0])


class Slot:
    """One worker position: its current process and what the harness is doing to it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.generation = 0
        self.proc: WorkerProcess | None = None
        self.state = "down"  # up, stopped, terminating, down
        self.until = 0.0  # stopped: SIGCONT at; terminating: SIGKILL at; down: restart at


class Chaos:
    def __init__(self, url: str, s: Settings, log_dir: Path, progress: bool = False) -> None:
        self.url = url
        self.progress = progress
        self.s = s
        self.log_dir = log_dir
        self.slots = [Slot(i) for i in range(s.workers)]
        self.all: list[WorkerProcess] = []
        self.summary = Summary(settings=s, logs=log_dir)
        self.enqueued: dict[uuid.UUID, Turn] = {}
        self.order: dict[uuid.UUID, list[uuid.UUID]] = {}  # conversation -> runs in enqueue order

    # -- processes -----------------------------------------------------------------------------

    def start(self, slot: Slot) -> None:
        slot.generation += 1
        name = f"chaos-w{slot.index}-g{slot.generation}"
        s = self.s
        args = [
            "--lease", str(s.lease), "--grace", str(s.grace), "--concurrency", str(s.concurrency),
            "--drain", str(s.drain), "--poll", "0.5", "--reap-interval", str(s.reap_interval),
        ]  # fmt: skip
        proc = WorkerProcess(self.url, name, args)
        self.all.append(proc)
        slot.proc, slot.state = proc, "up"

    def tend(self, now: float) -> None:
        """Move each slot on: resume a paused worker, kill a drain that takes too long, restart."""
        for slot in self.slots:
            proc = slot.proc
            if slot.state == "stopped" and now >= slot.until:
                assert proc is not None
                proc.signal(signal.SIGCONT)
                slot.state = "up"
            elif slot.state == "terminating":
                assert proc is not None
                if proc.proc.poll() is not None:
                    slot.state, slot.until = "down", now
                elif now >= slot.until:
                    proc.kill()
                    slot.state, slot.until = "down", now
            elif slot.state == "up" and proc is not None and proc.proc.poll() is not None:
                slot.state, slot.until = "down", now  # died by itself: the log says why
                self.summary.violations.append(
                    f"worker {proc.name} exited by itself ({proc.proc.returncode})"
                )
            if slot.state == "down" and now >= slot.until:
                self.start(slot)
                self.summary.restarts += 1

    def inject(self, fault: Fault, now: float) -> None:
        n = len(self.slots)
        # Aimed at a slot that is down or paused: the next slot that is up takes it.
        up = [
            self.slots[(fault.slot + i) % n]
            for i in range(n)
            if self.slots[(fault.slot + i) % n].state == "up"
        ]
        if not up or up[0].proc is None:
            self.summary.faults["skipped"] += 1
            return
        slot = up[0]
        self.summary.faults[fault.kind] += 1
        if fault.kind == "kill":
            slot.proc.kill()
            slot.state, slot.until = "down", now + fault.pause
        elif fault.kind == "stop":
            slot.proc.signal(signal.SIGSTOP)
            slot.state, slot.until = "stopped", now + fault.pause
        else:
            slot.proc.signal(signal.SIGTERM)
            slot.state, slot.until = "terminating", now + self.s.drain + 10

    def stop_all(self) -> None:
        for proc in self.all:
            with contextlib.suppress(Exception):
                proc.close()  # SIGCONT, SIGKILL, reap

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> Summary:
        s = self.s
        began = time.monotonic()
        plan = enqueue_plan(s)
        faults = fault_schedule(s)
        with psycopg.connect(self.url, autocommit=True) as db:
            for slot in self.slots:
                self.start(slot)
            next_check = next_note = 0.0
            while True:
                now = time.monotonic() - began
                while plan and plan[0][0] <= now:
                    self.enqueue(db, plan.pop(0)[1])
                while faults and faults[0].at <= now:
                    self.inject(faults.pop(0), now)
                self.tend(now)
                if now >= next_check:
                    self.sample(db)
                    next_check = now + 0.5
                if self.progress and now >= next_note:
                    self.note(db, now)
                    next_note = now + 15
                if not plan and not faults and now >= s.duration:
                    break
                time.sleep(0.05)
            # Faults over: every slot runs again and the fleet finishes the work.
            settle_until = time.monotonic() + s.settle
            while time.monotonic() < settle_until:
                now = time.monotonic() - began
                for slot in self.slots:
                    if slot.state == "stopped":
                        slot.until = now
                self.tend(now)
                self.sample(db)
                if self.open_runs(db) == 0:
                    break
                time.sleep(0.25)
            for slot in self.slots:  # a clean SIGTERM drain of an idle fleet
                if slot.state == "up" and slot.proc is not None:
                    slot.proc.signal(signal.SIGTERM)
            for slot in self.slots:
                if slot.state == "up" and slot.proc is not None:
                    with contextlib.suppress(Exception):
                        slot.proc.wait_exit(s.drain + 10)
            self.check(db)
        self.summary.seconds = time.monotonic() - began
        return self.summary

    def enqueue(self, db: psycopg.Connection, turns: list[Turn]) -> None:
        for t in turns:
            run = enqueue_echo(
                db, t.text, t.duration, conversation_id=t.conversation, max_attempts=self.s.max_attempts
            )
            self.enqueued[run] = t
            self.order.setdefault(t.conversation, []).append(run)

    def note(self, db: psycopg.Connection, now: float) -> None:
        done = ", ".join(f"{k} {v}" for k, v in sorted(self.summary.faults.items())) or "none yet"
        print(
            f"[{now:5.0f}s] enqueued {len(self.enqueued)}/{self.s.runs}, open {self.open_runs(db)}, "
            f"faults: {done}",
            file=sys.stderr,
            flush=True,
        )

    @staticmethod
    def open_runs(db: psycopg.Connection) -> int:
        row = db.execute(
            "SELECT count(*) FROM runrow.agent_run "
            "WHERE status NOT IN ('completed', 'failed', 'cancelled', 'dead')"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def sample(self, db: psycopg.Connection) -> None:
        """One snapshot of what must hold at every instant (the schema enforces it; this watches)."""
        for conv, active in db.execute(
            "SELECT conversation_id, count(*) FROM runrow.agent_run WHERE status IN ('running', 'waiting') "
            "GROUP BY conversation_id HAVING count(*) > 1"
        ).fetchall():
            self.flag(f"conversation {conv}: {active} active turns at once")
        for run, earlier in db.execute(
            "SELECT r.id, e.id FROM runrow.agent_run AS r JOIN runrow.agent_run AS e "
            "ON e.conversation_id = r.conversation_id AND e.enqueue_seq < r.enqueue_seq "
            "WHERE r.status = 'running' AND e.status = 'queued'"
        ).fetchall():
            self.flag(f"run {run} ran while the earlier turn {earlier} was queued")

    def flag(self, violation: str) -> None:
        """Once per violation, however many samples see it."""
        if violation not in self.summary.violations:
            self.summary.violations.append(violation)

    # -- the checks -----------------------------------------------------------------------------

    def check(self, db: psycopg.Connection) -> None:
        v = self.summary.violations
        rows = db.execute(
            "SELECT id, conversation_id, status, attempt, result, finished_at FROM runrow.agent_run"
        ).fetchall()
        runs = {r[0]: r for r in rows}
        self.summary.runs = len(self.enqueued)
        self.summary.conversations = len(self.order)
        for run in self.enqueued.keys() - runs.keys():
            v.append(f"run {run} was enqueued and is gone")
        for run in runs.keys() - self.enqueued.keys():
            v.append(f"run {run} exists but was never enqueued")
        journals: dict[uuid.UUID, list[tuple[int, str, dict[str, Any]]]] = {}
        for run, seq, kind, payload in db.execute(
            "SELECT run_id, seq, type, payload FROM runrow.run_event ORDER BY run_id, seq"
        ).fetchall():
            journals.setdefault(run, []).append((seq, kind, payload))
        for run, (_, _, status, attempt, result, _) in runs.items():
            self.summary.statuses[status] += 1
            self.summary.attempts[attempt] += 1
            if status not in TERMINAL:
                v.append(f"run {run} is still {status} after the settle time")
            self.check_journal(run, status, result, journals.get(run, []))
        for conv, order in self.order.items():
            ended = [runs[r][5] for r in order if r in runs]
            if None in ended:
                continue  # reported above as not terminal
            for k in range(1, len(ended)):
                if not ended[k - 1] < ended[k]:
                    v.append(f"conversation {conv}: turn {k} ended at {ended[k]}, before turn {k - 1} did")
        for invariant, run, detail in db.execute(
            "SELECT invariant, run_id, detail FROM runrow.audit()"
        ).fetchall():
            v.append(f"audit: {invariant} {run or ''} {detail}")

    def check_journal(
        self, run: uuid.UUID, status: str, result: Any, journal: list[tuple[int, str, dict[str, Any]]]
    ) -> None:
        v = self.summary.violations
        seqs = [seq for seq, _, _ in journal]
        if seqs != list(range(1, len(seqs) + 1)):
            v.append(f"run {run}: journal seqs are not 1..{len(seqs)}")
        completes = [i for i, (_, kind, _) in enumerate(journal) if kind == "complete"]
        if len(completes) != 1:
            v.append(f"run {run}: {len(completes)} complete events")
        elif completes[0] != len(journal) - 1:
            v.append(
                f"run {run}: events after its complete: {[k for _, k, _ in journal[completes[0] + 1 :]]}"
            )
        elif journal[-1][2].get("status") != status:
            v.append(f"run {run}: complete says {journal[-1][2].get('status')}, the run is {status}")
        for _, kind, payload in journal:
            if kind == "run_requeued":
                error = str(payload.get("error") or "")
                self.summary.requeues[error.split(":")[0].split(" (")[0] or "no error"] += 1
                self.summary.reaps += error.startswith("lease expired")
        if (
            journal
            and journal[-1][1] == "complete"
            and str(journal[-1][2].get("error") or "").startswith("lease")
        ):
            self.summary.reaps += 1
        claims = [i for i, (_, kind, _) in enumerate(journal) if kind == "run_claimed"]
        if not claims:
            if status != "cancelled":
                v.append(f"run {run}: {status} and never claimed")
            return
        final = "".join(
            str(p.get("text", "")) for _, kind, p in journal[claims[-1] + 1 :] if kind == "text_delta"
        )
        text = result.get("text") if isinstance(result, dict) else None
        if text is not None and text != final:
            v.append(
                f"run {run} ({status}, attempt {len(claims)}): result text {len(text)} chars, the final "
                f"attempt journaled {len(final)}: {journal_shape(journal[claims[-1] :])}"
            )
        if status == "completed" and run in self.enqueued and text != self.enqueued[run].text:
            v.append(f"run {run}: completed with {text!r}, the echo was {self.enqueued[run].text!r}")


def journal_shape(events: list[tuple[int, str, dict[str, Any]]]) -> str:
    """The event types of a journal, runs of one type folded: run_claimed, text_delta x4, ..."""
    out: list[str] = []
    for _, kind, _ in events:
        if out and out[-1].split(" x")[0] == kind:
            head, _, n = out[-1].partition(" x")
            out[-1] = f"{head} x{int(n or 1) + 1}"
        else:
            out.append(kind)
    return ", ".join(out)


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """A fresh migrated database of the harness's own, on the given server or a throwaway one."""
    if url:
        with devdb.temporary_database(url, "runrow_chaos") as db:
            yield db
        return
    with devdb.throwaway() as cluster, devdb.temporary_database(cluster.url, "runrow_chaos") as db:
        yield db


def run_chaos(url: str | None, s: Settings, keep_logs: bool = False, progress: bool = False) -> Summary:
    """Run the chaos against a fresh database; kill everything it started before returning.
    Worker logs are kept (and named in the summary) when a check failed or `keep_logs`."""
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"runrow-chaos-{s.seed}-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    with database(url) as db_url:
        chaos = Chaos(db_url, s, log_dir, progress)
        try:
            summary = chaos.run()
        finally:
            chaos.stop_all()
            for proc in chaos.all:
                with contextlib.suppress(OSError):
                    shutil.move(str(proc.log_path), log_dir / f"{proc.name}.log")
    if summary.violations or keep_logs:
        summary.logs = log_dir
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
        summary.logs = None
    return summary


def main(argv: list[str] | None = None) -> int:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--duration", type=float, default=d.duration, help="seconds of faults (default %(default)s)"
    )
    p.add_argument("--workers", type=int, default=d.workers, help="worker processes (default %(default)s)")
    p.add_argument("--runs", type=int, default=d.runs, help="runs to enqueue (default %(default)s)")
    p.add_argument("--turns", type=int, default=d.turns, help="turns per conversation (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="fault and run schedule (default: random, printed)")
    p.add_argument("--lease", type=int, default=d.lease, help="worker --lease (default %(default)s)")
    p.add_argument("--grace", type=int, default=d.grace, help="worker --grace (default %(default)s)")
    p.add_argument("--max-attempts", type=int, default=d.max_attempts, help="per run (default %(default)s)")
    p.add_argument("--settle", type=float, default=d.settle, help="most seconds to wait for the end")
    p.add_argument("--keep-logs", action="store_true", help="keep the worker logs even when all is well")
    p.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL"), help="server (default: throwaway)"
    )
    a = p.parse_args(argv)
    minimums = {"workers": 1, "runs": 1, "turns": 1, "lease": 1, "grace": 0, "max_attempts": 1}
    for name, lo in minimums.items():
        if (value := getattr(a, name)) < lo:
            p.error(f"--{name.replace('_', '-')} must be at least {lo}, got {value}")
    if not (a.duration > 0 and a.settle > 0):
        p.error("--duration and --settle must be positive")
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1_000_000)
    s = Settings(
        duration=a.duration, workers=a.workers, runs=a.runs, turns=a.turns, seed=seed, lease=a.lease,
        grace=a.grace, max_attempts=a.max_attempts, settle=a.settle,
    )  # fmt: skip
    summary = run_chaos(a.database_url, s, keep_logs=a.keep_logs, progress=True)
    print(summary.render())
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
