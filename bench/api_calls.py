"""Backend instructions per call of the functions a running agent calls, counted by callgrind.

bench.instructions counts the drain (a claim and an ending per run); a real agent run also pays
for its enqueue, its heartbeats, the stream's appends, each model request's admission and each
step and tool call. Their fixed costs per call (argument checks, helper calls, statements that only return a
row of values) are invisible in the drain and too small to time on a shared box, so this counts
them in a unit the box does not move.

What it counts: for each call below, one session makes SMALL calls and another LARGE calls, each
in a database of its own prepared beforehand at full speed (runs enqueued and claimed there), on a
private cluster whose postmaster runs under `valgrind --tool=callgrind` (bench.instructions'
cluster); the figure is the difference of the two sessions' instructions over the difference of
calls, so connection start-up and the first call's planning cancel out. Each call is its own
transaction (autocommit), sent as a prepared statement, as a client in any language would send
it. Each session's result is checked: every call did what it is for (a heartbeat owned its run, an
append and a step got the next seq, a tool call was begun (execute) or completed (its tool_result
step), a webhook delivery was claimed (one a call) or completed, a finish finished). The tool calls
are an idempotent tool's, one per run, each run's model turn asking for it; the deliveries are
those of runs enqueued with a webhook URL and finished.

    python -m bench.api_calls [--calls enqueue_run heartbeat ...] [--small 100] [--large 300]
                              [--json PATH] [--keep DIR]

`--keep DIR` copies each session's callgrind file there, so `callgrind_annotate` (or
bench.by_function's per_run of the SMALL and LARGE files) shows where a call's instructions go.

It needs valgrind (`apt-get install valgrind`). The defaults take about a minute.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.common import ON_A_CLUSTER, cli
from bench.instructions import instructions, under_callgrind
from pyworker.db.devdb import database_url_for, throwaway
from pyworker.db.migrate import migrate

ENQUEUE = (
    "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"hello\"', model => 'bench')"
)
# The runs each session's calls are made for: offered the tool their model turn asks for
# (begin_tool_call runs only a tool its run was enqueued with).
PREPARED_RUN = (
    "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"hello\"', model => 'bench',"
    """ tools => '[{"name": "weather", "input_schema": {"type": "object"}}]')"""
)
DELTA = json.dumps([{"type": "text_delta", "index": 0, "text": "word " * 8}])
TURN = json.dumps([{"type": "text", "text": "an answer"}])
# A model turn asking for one tool call: what begin_tool_call and complete_tool_call answer.
TOOL_INPUT = {"city": "Paris"}
TOOL_ARGS = json.dumps(TOOL_INPUT)
TOOL_TURN = json.dumps(
    [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": TOOL_INPUT},
    ]
)


@dataclass(frozen=True)
class Shape:
    """One call: its SQL, the runs it needs claimed beforehand (per call, or one for all), and
    how a session makes n of them and checks they did their work."""

    sql: str
    runs: Callable[[int], int]  # runs to enqueue and claim in setup, for n calls
    session: Callable[[psycopg.Connection, str, list[tuple], int], None]
    # What the calls need written first, given the claimed runs and n: returns each call's
    # parameters (default: the run's id and claim token).
    setup: Callable[[psycopg.Connection, list[tuple[uuid.UUID, uuid.UUID]], int], list[tuple]] | None = None


def _each(conn: psycopg.Connection, sql: str, params: list[tuple[object, ...]]) -> list[tuple]:
    return [conn.execute(sql, p, prepare=True).fetchone() for p in params]


def _enqueue(conn: psycopg.Connection, sql: str, runs: list, n: int) -> None:
    rows = _each(conn, sql, [(uuid.uuid4(),) for _ in range(n)])
    assert all(r is not None and r[0] is not None for r in rows), "an enqueue returned no run"


def _heartbeat(conn: psycopg.Connection, sql: str, runs: list, n: int) -> None:
    rows = _each(conn, sql, [runs[0]] * n)
    assert rows == [(True, False)] * n, "a heartbeat did not own its run"


def _next_seqs(conn: psycopg.Connection, sql: str, runs: list, n: int) -> None:
    """An append (of events or of a step): each call got the run's next seq."""
    seqs = [r[0] for r in _each(conn, sql, [runs[0]] * n)]
    assert None not in seqs and seqs == list(range(seqs[0], seqs[0] + n)), f"{sql}: seqs {seqs[:5]}..."


BATCH_RUNS = 10  # append_runs_events' shape: a worker's flush of ten streaming runs


def _batch_seqs(conn: psycopg.Connection, sql: str, runs: list, n: int) -> None:
    """append_runs_events of one delta to each of BATCH_RUNS runs, n times: every run got its
    next seq in every call."""
    batch = json.dumps(
        [{"run_id": str(r), "claim_token": str(t), "events": [json.loads(DELTA)[0]]} for r, t in runs]
    )
    calls = [[row[0] for row in conn.execute(sql, (batch,), prepare=True).fetchall()] for _ in range(n)]
    for i in range(len(runs)):
        seqs = [call[i] for call in calls]
        assert None not in seqs and seqs == list(range(seqs[0], seqs[0] + n)), f"run {i}: seqs {seqs[:5]}..."


def _acquire(conn: psycopg.Connection, sql: str, runs: list, n: int) -> None:
    rows = _each(conn, sql, [runs[0]] * n)
    assert all(r is not None and r[0] for r in rows), "a model call was not granted"


def _finish(conn: psycopg.Connection, sql: str, runs: list, n: int) -> None:
    rows = _each(conn, sql, runs[:n])
    assert rows == [(True,)] * n, "a finish was fenced out"


def _read(conn: psycopg.Connection, sql: str, runs: list, n: int) -> None:
    rows = _each(conn, sql, [runs[0][:1]] * n)
    # The run's journal holds its enqueue's events and its run_claimed.
    assert all(r is not None and r[0] > 0 for r in rows), "read_events read no event"


def _tool_turns(conn: psycopg.Connection, runs: list[tuple[uuid.UUID, uuid.UUID]], n: int = 0) -> list[tuple]:
    """Each run's model turn asks for one tool call; the call's key, as a worker derives it."""
    params = []
    for run_id, token in runs:
        seq = conn.execute(
            "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)", (run_id, token, TOOL_TURN)
        ).fetchone()[0]
        key = conn.execute(
            "SELECT runrow.tool_call_key(%s, %s, 'toolu_1', 'weather', %s::jsonb)", (run_id, seq, TOOL_ARGS)
        ).fetchone()[0]
        params.append((run_id, token, key))
    return params


def _tool_calls_begun(
    conn: psycopg.Connection, runs: list[tuple[uuid.UUID, uuid.UUID]], n: int
) -> list[tuple]:
    params = _tool_turns(conn, runs)
    for run_id, token, key in params:
        conn.execute(BEGIN_TOOL_CALL, (run_id, token, key))
    return params


def _begin(conn: psycopg.Connection, sql: str, params: list, n: int) -> None:
    rows = _each(conn, sql, params[:n])
    assert rows == [("execute",)] * n, "a tool call was not begun"


def _complete(conn: psycopg.Connection, sql: str, params: list, n: int) -> None:
    rows = _each(conn, sql, params[:n])
    # The tool_result step follows the model turn (seq 1) in each run.
    assert rows == [(2,)] * n, "a tool call was not completed"


def _webhook_runs(conn: psycopg.Connection, n: int) -> None:
    """n runs enqueued with a webhook URL, claimed and finished: n deliveries pending, each to a
    receiver of its own (a claim leases at most 4 to one receiver at a time, fleet-wide)."""
    for i in range(n):
        conn.execute(
            "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"hello\"',"
            " model => 'bench', webhook_url => %s)",
            (uuid.uuid4(), f"https://hooks-{i}.example/runs"),
        )
    for run_id, token in conn.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('bench', %s, 3600)", (n,)
    ).fetchall():
        conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token))


def _deliveries_due(conn: psycopg.Connection, runs: list, n: int) -> list[tuple]:
    _webhook_runs(conn, n)
    return []


def _deliveries_claimed(conn: psycopg.Connection, runs: list, n: int) -> list[tuple]:
    _webhook_runs(conn, n)
    return conn.execute(
        "SELECT delivery_id, claim_token FROM runrow.claim_webhook_deliveries('bench', %s)", (n,)
    ).fetchall()


def _claim_deliveries(conn: psycopg.Connection, sql: str, params: list, n: int) -> None:
    rows = [conn.execute(sql, prepare=True).fetchall() for _ in range(n)]
    assert all(len(r) == 1 and r[0][0] is not None for r in rows), "a claim took no delivery"


def _complete_deliveries(conn: psycopg.Connection, sql: str, params: list, n: int) -> None:
    rows = _each(conn, sql, params[:n])
    assert rows == [(True,)] * n, "a delivery was not completed"


BEGIN_TOOL_CALL = (
    f"SELECT state FROM runrow.begin_tool_call(%s, %s, %s, 'weather', '{TOOL_ARGS}', 'idempotent')"
)

SHAPES: dict[str, Shape] = {
    "enqueue_run": Shape(ENQUEUE, lambda n: 0, _enqueue),
    "heartbeat": Shape(
        "SELECT owned, cancel_requested FROM runrow.heartbeat(%s, %s, 30)", lambda n: 1, _heartbeat
    ),
    "append_events": Shape(f"SELECT runrow.append_events(%s, %s, '{DELTA}'::jsonb)", lambda n: 1, _next_seqs),
    # Per call: ten runs' appends, which ten append_events calls made before (divide by ten).
    f"append_runs_events_x{BATCH_RUNS}": Shape(
        "SELECT last_seq FROM runrow.append_runs_events(%s::jsonb)", lambda n: BATCH_RUNS, _batch_seqs
    ),
    "acquire_model_call": Shape(
        "SELECT granted FROM runrow.acquire_model_call(%s, %s, 1000)", lambda n: 1, _acquire
    ),
    "append_step": Shape(
        f"SELECT runrow.append_step(%s, %s, 'model_turn', '{TURN}'::json)", lambda n: 1, _next_seqs
    ),
    "finish_run": Shape("SELECT runrow.finish_run(%s, %s, 'completed')", lambda n: n, _finish),
    "read_events": Shape(
        "SELECT count(*) FROM runrow.read_events(run_id => %s, after_seq => 0)", lambda n: 1, _read
    ),
    "begin_tool_call": Shape(BEGIN_TOOL_CALL, lambda n: n, _begin, _tool_turns),
    "complete_tool_call": Shape(
        'SELECT runrow.complete_tool_call(%s, %s, %s, \'{"forecast": "sun"}\')',
        lambda n: n,
        _complete,
        _tool_calls_begun,
    ),
    "claim_webhook_deliveries": Shape(
        "SELECT delivery_id FROM runrow.claim_webhook_deliveries('bench', 1)",
        lambda n: 0,
        _claim_deliveries,
        _deliveries_due,
    ),
    "complete_webhook_delivery": Shape(
        "SELECT runrow.complete_webhook_delivery(%s, %s, 200)",
        lambda n: 0,
        _complete_deliveries,
        _deliveries_claimed,
    ),
}


def prepare(url: str, shape: Shape, n: int) -> list[tuple]:
    """Migrate the database, claim the runs the shape needs and write what its calls need;
    returns each call's parameters ((run_id, claim_token) unless the shape sets them up)."""
    migrate(url)
    runs = shape.runs(n)
    if runs == 0 and shape.setup is None:
        return []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(runs):
            conn.execute(PREPARED_RUN, (uuid.uuid4(),))
        claimed = []
        if runs:
            claimed = conn.execute(
                "SELECT run_id, claim_token FROM runrow.claim_runs(worker_id => 'bench', max_runs => %s,"
                " lease_seconds => 3600)",
                (runs,),
            ).fetchall()
        assert len(claimed) == runs, f"claimed {len(claimed)} of {runs} runs"
        params = claimed if shape.setup is None else shape.setup(conn, claimed, n)
        conn.execute("VACUUM ANALYZE runrow.agent_run")
    return params


def session(url: str, shape: Shape, runs: list[tuple], n: int) -> int:
    """Make n calls in one session; returns the backend's pid."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        shape.session(conn, shape.sql, runs, n)
    return int(row[0])


def count(calls: list[str], small: int = 100, large: int = 300, keep: Path | None = None) -> dict[str, float]:
    """Instructions per call of each named call; with keep, each session's callgrind file is
    copied there as CALL-N.callgrind (to read with callgrind_annotate or bench.by_function)."""
    figures: dict[str, float] = {}
    with throwaway() as cluster:
        prepared: dict[tuple[str, int], tuple[str, list]] = {}
        with psycopg.connect(cluster.superuser_url, autocommit=True) as conn:
            for name in calls:
                for n in (small, large):
                    db = f"calls_{name}_{n}"
                    conn.execute(f"CREATE DATABASE {db} OWNER runrow_admin")
                    url = database_url_for(cluster.url, db)
                    prepared[name, n] = url, prepare(url, SHAPES[name], n)
        outdir = Path(cluster.root) / "callgrind"
        outdir.mkdir()
        under_callgrind(cluster, outdir)
        for name in calls:
            totals = {}
            for n in (small, large):
                url, runs = prepared[name, n]
                pid = session(url, SHAPES[name], runs, n)
                totals[n] = instructions(outdir, pid)
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(outdir / f"cg.{pid}", keep / f"{name}-{n}.callgrind")
            figures[name] = (totals[large] - totals[small]) / (large - small)
    return figures


def report(figures: dict[str, float]) -> list[str]:
    lines = ["=== backend instructions per call (callgrind; each call its own transaction) ==="]
    lines += [f"  {name + ':':<22} {figure:>12,.0f}" for name, figure in figures.items()]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = cli(
        "bench.api_calls",
        "Backend instructions per call of the functions a running agent calls (enqueue, "
        "heartbeat, appends, model-call admission, steps, tool calls, finish, reads), counted by "
        "callgrind as the difference between a SMALL and a LARGE session of calls.",
        ON_A_CLUSTER,
    )
    parser.add_argument(
        "--calls",
        nargs="+",
        choices=list(SHAPES),
        default=list(SHAPES),
        metavar="CALL",
        help=f"which calls to count (default all: {', '.join(SHAPES)})",
    )
    parser.add_argument("--small", type=int, default=100, help="calls of the smaller session (default 100)")
    parser.add_argument("--large", type=int, default=300, help="calls of the larger session (default 300)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="copy each session's callgrind file to DIR as CALL-N.callgrind, to read with callgrind_annotate",
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        sys.exit("bench.api_calls: valgrind is not installed (apt-get install valgrind)")
    if args.large <= args.small or args.small < 1:
        parser.error("--large must be more than --small, and --small at least 1")
    figures = count(args.calls, args.small, args.large, args.keep)
    for line in report(figures):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
