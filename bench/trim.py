"""What trimming a day of journals costs, and whether DELETE-based trimming bloats or slows.

N finished runs, each with a journal like a streamed answer's (user_message_created,
run_queued, run_claimed, message_start, 20 text_delta, message_stop, complete: 26 rows) and one
model_turn step, are written through the SQL API (enqueue_run, claim_runs, append_events,
append_step, finish_runs; batches of 1,000 runs, one transaction each). Then
`trim_journal('0 seconds')`, called as the reaper does until it finds nothing (at most 10,000
runs per call), trims all of them (terminal rows are immutable, so their
finished_at cannot be backdated: a zero older_than stands in for "a day ago"). Measured, none
of it on the machine's speed except the wall times:

- the heap (pg_relation_size) and index (pg_indexes_size) bytes of run_event, agent_run and
  run_request (the request snapshots, migration 0061)
  before the trim, right after it, after VACUUM, and after a second fill of N runs (begun after
  one more VACUUM, as the next autovacuum would: it recycles the index pages the first one
  emptied): if the deleted space is reused the second fill fits in it, otherwise the tables
  grow by N again (bloat);
- the WAL bytes (pg_current_wal_lsn before and after) and wall time of the trim and of the
  VACUUM that follows it, set against the WAL of the fill that wrote the journals;
- shared buffers of an empty claim, a claim and a finish (bench.claim_buffers) before the trim,
  right after it (autovacuum held off on both tables, so no vacuum has run) and after VACUUM.

The bench checks itself: every run completed once (attempt 1), its journal whole before the
trim and gone after it (read_events still ends it with a synthesized complete), its step kept,
and audit() clean at the end. `python -m bench.trim [--short | --runs N] [--json FILE]`:
N = 1,000,000, or 20,000 with --short; --json writes the figures to FILE. At 1,000,000 a fill
takes about 20 minutes on 2 cores (1,218 s in issue 11's stop 48), the trim about a minute, and
the whole run an hour or more.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import psycopg

from bench.claim_buffers import buffers, lifecycle_calls
from bench.common import bench_database, cli, run_alone

FULL = 1_000_000
SHORT = 20_000
DELTAS = 20
# user_message_created and run_queued (enqueue), run_claimed, message_start, the deltas,
# message_stop, complete
EVENTS_PER_RUN = DELTAS + 6
TABLES = ("run_event", "agent_run", "run_request")
# A run of `agent_run AS a` whose request snapshot trim_journal has dropped (migration 0061).
TRIMMED = "NOT EXISTS (SELECT FROM runrow.run_request AS q WHERE q.run_id = a.id)"


@dataclass
class Cost:
    seconds: float
    wal: int


def wal_lsn(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def measured(conn: psycopg.Connection, sql: str) -> tuple[Cost, object]:
    """Wall time and WAL bytes of one statement, and its first value."""
    start_lsn = wal_lsn(conn)
    started = time.monotonic()
    cur = conn.execute(sql)
    row = cur.fetchone() if cur.description else None
    seconds = time.monotonic() - started
    diff = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)::bigint", (start_lsn,)).fetchone()
    assert diff is not None
    return Cost(seconds, int(diff[0])), (row[0] if row else None)


def fill(conn: psycopg.Connection, runs: int, batch: int = 1000) -> Cost:
    """`runs` runs enqueued, claimed, streamed, stepped and completed, `batch` per transaction.
    Each answer is the concatenation of its deltas, as audit() demands of a completed run."""
    cost, _ = measured(
        conn,
        f"""
        DO $fill$
        DECLARE
            ids uuid[];
            tokens uuid[];
            answer text := (SELECT string_agg(format('word%s of a streamed answer; ', i), '' ORDER BY i)
                            FROM generate_series(1, {DELTAS}) AS i);
            events jsonb :=
                jsonb_build_array(jsonb_build_object('type', 'message_start', 'role', 'assistant'))
                || (SELECT jsonb_agg(jsonb_build_object('type', 'text_delta', 'index', 0,
                                                         'text', format('word%s of a streamed answer; ', i))
                                     ORDER BY i)
                    FROM generate_series(1, {DELTAS}) AS i)
                || jsonb_build_array(jsonb_build_object('type', 'message_stop', 'stop_reason', 'end_turn'));
            step json := json_build_array(json_build_object('type', 'text', 'text', answer));
        BEGIN
            FOR b IN 1..{-(-runs // batch)} LOOP
                PERFORM runrow.enqueue_run(gen_random_uuid(), '"a question"', 'bench')
                FROM generate_series(1, least({batch}, {runs} - (b - 1) * {batch}));
                LOOP
                    SELECT array_agg(c.run_id), array_agg(c.claim_token) INTO ids, tokens
                    FROM runrow.claim_runs('filler', {batch}, 30) AS c;
                    EXIT WHEN ids IS NULL;
                    PERFORM runrow.append_events(u.id, u.token, events)
                    FROM unnest(ids, tokens) AS u (id, token);
                    PERFORM runrow.append_step(u.id, u.token, 'model_turn', step)
                    FROM unnest(ids, tokens) AS u (id, token);
                    PERFORM runrow.finish_runs(jsonb_agg(jsonb_build_object(
                        'run_id', u.id, 'claim_token', u.token, 'status', 'completed',
                        'result', jsonb_build_object('text', answer))))
                    FROM unnest(ids, tokens) AS u (id, token);
                END LOOP;
                COMMIT;
            END LOOP;
        END
        $fill$
        """,
    )
    conn.execute("VACUUM ANALYZE runrow.agent_run, runrow.run_event, runrow.agent_step, runrow.message")
    return cost


def sizes(conn: psycopg.Connection) -> dict[str, tuple[int, int]]:
    """(heap bytes, index bytes) per table."""
    out: dict[str, tuple[int, int]] = {}
    for table in TABLES:
        row = conn.execute(
            "SELECT pg_relation_size(%(t)s::regclass), pg_indexes_size(%(t)s::regclass)",
            {"t": f"runrow.{table}"},
        ).fetchone()
        assert row is not None
        out[table] = (int(row[0]), int(row[1]))
    return out


def calls(conn: psycopg.Connection) -> dict[str, int]:
    """Buffers of an empty claim, then of a claim and a finish (a probe run, completed after)."""
    empty, rows = buffers(conn, "SELECT * FROM runrow.claim_run('probe', 30)")
    assert rows == 0
    lifecycle = lifecycle_calls(conn)
    return {"empty claim": empty, "claim": lifecycle["claim"], "finish": lifecycle["finish"]}


def scalar(conn: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> object:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def count(conn: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> int:
    value = scalar(conn, sql, params)
    assert isinstance(value, int)
    return value


def check_filled(conn: psycopg.Connection, runs: int) -> None:
    """Every bench run completed on its first attempt with its whole journal and its step."""
    bad = count(
        conn,
        "SELECT count(*) FROM runrow.agent_run AS a WHERE a.model = 'bench' AND a.worker_id = 'filler'"
        " AND (a.status <> 'completed' OR a.attempt <> 1"
        f"      OR {TRIMMED}"
        "      OR (SELECT count(*) FROM runrow.run_event AS e WHERE e.run_id = a.id) <> %s"
        "      OR (SELECT count(*) FROM runrow.agent_step AS s WHERE s.run_id = a.id) <> 1)",
        (EVENTS_PER_RUN,),
    )
    assert bad == 0, f"{bad} filled runs are not completed once with {EVENTS_PER_RUN} events and 1 step"
    got = count(conn, "SELECT count(*) FROM runrow.agent_run WHERE worker_id = 'filler'")
    assert got == runs, f"{got} filled runs, expected {runs}"


def check_trimmed(conn: psycopg.Connection, trimmed: int) -> None:
    """The trimmed runs have no journal and no snapshot, keep their steps, and still read as
    complete; nothing that was not terminal was touched."""
    left = count(
        conn,
        "SELECT count(*) FROM runrow.run_event AS e JOIN runrow.agent_run AS a ON a.id = e.run_id"
        f" WHERE {TRIMMED}",
    )
    assert left == 0, f"{left} journal rows of trimmed runs are left"
    snapshots = count(
        conn,
        f"SELECT count(*) FROM runrow.agent_run AS a WHERE a.finished_at IS NOT NULL AND {TRIMMED}",
    )
    assert snapshots == trimmed, f"{snapshots} runs lost their snapshot, {trimmed} were trimmed"
    steps = count(
        conn,
        "SELECT count(*) FROM runrow.agent_step AS s JOIN runrow.agent_run AS a ON a.id = s.run_id"
        f" WHERE {TRIMMED}",
    )
    filled = count(
        conn,
        f"SELECT count(*) FROM runrow.agent_run AS a WHERE a.worker_id = 'filler' AND {TRIMMED}",
    )
    assert steps == filled, f"{steps} steps kept of the {filled} trimmed bench runs"
    sample = scalar(conn, "SELECT id FROM runrow.agent_run WHERE worker_id = 'filler' ORDER BY id LIMIT 1")
    frames = conn.execute(
        "SELECT type FROM runrow.read_events(run_id => %s, after_seq => 0, max_events => 100)", (sample,)
    ).fetchall()
    assert frames == [("complete",)], f"a trimmed run reads as {frames}, not one synthesized complete"


def autovacuum(conn: psycopg.Connection, on: bool) -> None:
    """Held off while the trimmed tables are measured before VACUUM, so no vacuum has run;
    RESET gives back what the migrations set (they leave autovacuum_enabled alone)."""
    for table in TABLES:
        if on:
            conn.execute(f"ALTER TABLE runrow.{table} RESET (autovacuum_enabled)")
        else:
            conn.execute(f"ALTER TABLE runrow.{table} SET (autovacuum_enabled = false)")


def mb(n: int) -> str:
    return f"{n / 1_048_576:,.1f} MB"


def growth(before: int, after: int) -> float:
    return (after - before) / before


def run(url: str, runs: int) -> tuple[list[str], dict[str, object]]:
    """The report and the figures behind it."""
    with psycopg.connect(url, autocommit=True) as conn:
        first_fill = fill(conn, runs)
        check_filled(conn, runs)
        at = {"before trim": sizes(conn)}
        cost = {"before trim": calls(conn)}
        journal = count(conn, "SELECT count(*) FROM runrow.run_event")
        autovacuum(conn, on=False)
        # As the reaper does: bounded calls (max_runs, 10,000 by default), oldest first, until
        # one finds nothing; each is its own transaction.
        trim, deleted, trims = Cost(0.0, 0), 0, 0
        while True:
            step, rows = measured(conn, "SELECT runrow.trim_journal('0 seconds')")
            trim = Cost(trim.seconds + step.seconds, trim.wal + step.wal)
            trims += 1
            if not rows:
                break
            assert isinstance(rows, int)
            deleted += rows
        assert deleted == journal, f"trim_journal deleted {deleted} rows of {journal}"
        at["after trim"] = sizes(conn)
        cost["after trim"] = calls(conn)
        vacuum, _ = measured(conn, "VACUUM runrow.run_event, runrow.agent_run, runrow.run_request")
        autovacuum(conn, on=True)
        conn.execute("ANALYZE runrow.run_event, runrow.agent_run, runrow.run_request")
        at["after VACUUM"] = sizes(conn)
        cost["after VACUUM"] = calls(conn)
        trimmed = count(conn, f"SELECT count(*) FROM runrow.agent_run AS a WHERE {TRIMMED}")
        check_trimmed(conn, trimmed)
        # The index pages the trim emptied are deleted by the first VACUUM but recyclable only
        # once no transaction older than that can still see them: the next (auto)vacuum of
        # the table puts them in the free space map. Without it the 2nd fill's index entries
        # all go to new pages (measured: run_event's indexes +100%).
        conn.execute("SELECT txid_current()")
        conn.execute("VACUUM runrow.run_event, runrow.agent_run, runrow.run_request")
        second_fill = fill(conn, runs)
        at["after 2nd fill"] = sizes(conn)
        cost["after 2nd fill"] = calls(conn)
        check_trimmed(conn, trimmed)
        problems = conn.execute("SELECT invariant, run_id, detail FROM runrow.audit()").fetchall()
        assert not problems, f"audit() reports {problems[:5]}"
        completed = count(conn, "SELECT count(*) FROM runrow.agent_run WHERE worker_id = 'filler'")
        assert completed == 2 * runs, f"{completed} bench runs completed, expected {2 * runs}"

    base, last = at["before trim"], at["after 2nd fill"]
    grew = {t: (growth(base[t][0], last[t][0]), growth(base[t][1], last[t][1])) for t in TABLES}
    lines = [
        f"trimming the journals of {runs:,} finished runs ({EVENTS_PER_RUN} events and 1 step each)",
        f"  fill: {first_fill.seconds:.0f} s, {mb(first_fill.wal)} of WAL;"
        f" 2nd fill {second_fill.seconds:.0f} s",
        f"  trim_journal: {deleted:,} rows in {trims} calls, {trim.seconds:.1f} s, {mb(trim.wal)} of WAL"
        f" ({trim.wal / first_fill.wal:.2f}x the fill's, {trim.wal / runs:,.0f} B per run);"
        f" VACUUM after it: {vacuum.seconds:.1f} s, {mb(vacuum.wal)} of WAL",
        "  heap / indexes (" + "; ".join(TABLES) + "):",
        *(
            f"    {stage}: " + "; ".join(f"{mb(sizes_[t][0])} / {mb(sizes_[t][1])}" for t in TABLES)
            for stage, sizes_ in at.items()
        ),
        "  the 2nd fill grew them by "
        + "; ".join(f"{t} heap {heap:+.0%}, indexes {index:+.0%}" for t, (heap, index) in grew.items())
        + " (+100% = no reuse)",
        "  shared buffers per call (empty claim / claim / finish):",
        *(f"    {stage}: {c['empty claim']} / {c['claim']} / {c['finish']}" for stage, c in cost.items()),
    ]
    figures: dict[str, object] = {
        "runs": runs,
        "events_per_run": EVENTS_PER_RUN,
        "fill": vars(first_fill),
        "second_fill": vars(second_fill),
        "trim": vars(trim),
        "vacuum": vars(vacuum),
        "deleted": deleted,
        "sizes": at,
        "second_fill_growth": grew,
        "buffers": cost,
    }
    return lines, figures


async def bench(url: str, runs: int = FULL) -> list[str]:
    lines, _ = run(url, runs)
    return lines


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli(
        "bench.trim",
        "What trimming a day of journals costs: N finished runs with a streamed answer's journal "
        "each, all trimmed by trim_journal as the reaper calls it; prints table sizes before the "
        "trim, after it, after VACUUM and after N more runs (bloat), the trim's WAL and time, and "
        "the buffers of a claim and a finish at each stage.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--short", action="store_true", help=f"{SHORT:,} runs instead of {FULL:,}")
    size.add_argument(
        "--runs",
        type=int,
        metavar="N",
        help=f"N runs (default {FULL:,}: about 20 minutes per fill on 2 cores, an hour and more in all)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be at least 1")
    args.runs = args.runs or (SHORT if args.short else FULL)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.json is None:
        run_alone("trim", lambda url: bench(url, args.runs))
        return
    with bench_database("trim") as url:
        lines, figures = run(url, args.runs)
    print("\n".join(lines))
    with open(args.json, "w") as f:
        json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
