"""What a claim and a finish cost the database, in shared buffers, as the tables grow.

Buffers are counted with EXPLAIN (ANALYZE, BUFFERS) of the call itself (every nested
statement included), inside a transaction that is rolled back, so nothing changes and the
figure does not depend on the machine's load. Two questions:

- an empty claim (nothing claimable) with no queued turns and with BLOCKED queued turns,
  each waiting behind a running turn of its conversation;
- a claim, a heartbeat, an append and a finish with FEW and with MANY finished runs in the
  tables (MANY is 1,000,000 in the full run: filled through the single-run functions in
  about an hour on 2 cores: 1,000,000 runs took 63 minutes, about 265 runs per second);
- a claim with UNVACUUMED runs ended since the last vacuum (autovacuum held off meanwhile):
  until a vacuum drops them, the index entries of runs that left the queue stay at its head,
  and the claim's walk steps over them. This is what `autovacuum_naptime` bounds on a busy
  queue (README, "Autovacuum").

`python -m bench.claim_buffers [--short] [--json FILE]` runs it alone; --json also writes the
figures to FILE.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import psycopg

from bench.common import bench_database, cli, run_alone

BLOCKED = 10_000
FEW = 1_000
MANY = 1_000_000
UNVACUUMED = 10_000


def buffers(conn: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> tuple[int, int]:
    """(shared buffers, rows) of one call, rolled back. The lowest of the last four of ten
    calls: PL/pgSQL plans a statement anew for each of its first five runs (planning reads
    index metapages too), so the steady cost is the one after them."""
    counts: list[tuple[int, int]] = []
    for _ in range(10):
        with conn.transaction(force_rollback=True):
            plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).fetchone()
            assert plan is not None
            node = plan[0][0]["Plan"]
        counts.append((node["Shared Hit Blocks"] + node["Shared Read Blocks"], node["Actual Rows"]))
    return min(counts[6:])


def vacuum_analyze(conn: psycopg.Connection) -> None:
    """What autovacuum would have done by now to the tables a lifecycle writes."""
    conn.execute("VACUUM ANALYZE runrow.agent_run, runrow.run_event, runrow.message")


def fill_finished(conn: psycopg.Connection, runs: int, batch: int = 2000, vacuum: bool = True) -> None:
    """`runs` enqueued, claimed and finished through the single-run functions, then (unless
    `vacuum` is false) VACUUM ANALYZE, as autovacuum would."""
    conn.execute(
        f"""
        DO $fill$
        BEGIN
            FOR b IN 1..{-(-runs // batch)} LOOP
                PERFORM runrow.enqueue_run(gen_random_uuid(), '"history"', 'bench')
                FROM generate_series(1, least({batch}, {runs} - (b - 1) * {batch}));
                LOOP
                    PERFORM 1 FROM runrow.claim_runs('filler', 1000, 30);
                    EXIT WHEN NOT FOUND;
                END LOOP;
                PERFORM runrow.finish_run(a.id, a.claim_token, 'completed')
                FROM runrow.agent_run AS a WHERE a.status = 'running';
                COMMIT;
            END LOOP;
        END
        $fill$
        """
    )
    if vacuum:
        vacuum_analyze(conn)


def lifecycle_calls(conn: psycopg.Connection) -> dict[str, int]:
    """Buffers of one claim (one queued run waiting), then of a heartbeat, an append of one
    event and a finish of the run it claimed."""
    conn.execute("SELECT runrow.enqueue_run(gen_random_uuid(), '\"probe\"', 'bench')")
    claim, rows = buffers(conn, "SELECT * FROM runrow.claim_run('probe', 30)")
    assert rows == 1
    run = conn.execute("SELECT run_id, claim_token FROM runrow.claim_run('probe', 30)").fetchone()
    assert run is not None
    heartbeat, _ = buffers(conn, "SELECT * FROM runrow.heartbeat(%s, %s, 30)", (run[0], run[1]))
    append, _ = buffers(
        conn,
        'SELECT runrow.append_events(%s, %s, \'[{"type": "text_delta", "text": "x"}]\')',
        (run[0], run[1]),
    )
    finish, _ = buffers(conn, "SELECT runrow.finish_run(%s, %s, 'completed')", (run[0], run[1]))
    conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run[0], run[1]))
    return {"claim": claim, "heartbeat": heartbeat, "append": append, "finish": finish}


def block(conn: psycopg.Connection, turns: int) -> None:
    """`turns` conversations, each with a running turn and a second turn queued behind it."""
    conn.execute(
        f"""
        DO $block$
        BEGIN
            PERFORM runrow.enqueue_run(gen_random_uuid(), '"first"', 'bench')
            FROM generate_series(1, {turns});
            LOOP
                PERFORM 1 FROM runrow.claim_runs('holder', 1000, 3600);
                EXIT WHEN NOT FOUND;
            END LOOP;
            PERFORM runrow.enqueue_run(a.conversation_id, '"second"', 'bench')
            FROM runrow.agent_run AS a WHERE a.status = 'running';
        END
        $block$
        """
    )
    vacuum_analyze(conn)


def measure(url: str, short: bool = False) -> dict[str, Any]:
    """Every figure of the report, by name (--json writes them; tests/test_bench_claim_buffers.py
    reads them)."""
    blocked, few, many, unvacuumed = (1_000, 100, 5_000, 1_000) if short else (BLOCKED, FEW, MANY, UNVACUUMED)
    with psycopg.connect(url, autocommit=True) as conn:
        empty, _ = buffers(conn, "SELECT * FROM runrow.claim_run('probe', 30)")
        block(conn, blocked)
        # The first empty claim after the burst may do one-time work on the new turns.
        first, rows = buffers(conn, "SELECT * FROM runrow.claim_run('probe', 30)")
        # A claim marks at most 500 blocked turns (walk_cap, functions/_claim_walk.sql), and
        # `first` was rolled back: these claims mark them all.
        for _ in range(-(-blocked // 500)):
            conn.execute("SELECT * FROM runrow.claim_run('probe', 30)")
        behind, rows = buffers(conn, "SELECT * FROM runrow.claim_run('probe', 30)")
        assert rows == 0
        # Once (auto)vacuum has dropped the index entries of the row versions that were marked.
        conn.execute("VACUUM runrow.agent_run")
        vacuumed, rows = buffers(conn, "SELECT * FROM runrow.claim_run('probe', 30)")
        assert rows == 0
        conn.execute(
            "SELECT runrow.stop_conversation(c.id) FROM (SELECT DISTINCT conversation_id AS id"
            " FROM runrow.agent_run WHERE status IN ('queued', 'running', 'waiting')) AS c"
        )
        conn.execute(
            "SELECT runrow.finish_run(a.id, a.claim_token, 'cancelled') FROM runrow.agent_run AS a"
            " WHERE a.status = 'running'"
        )
        fill_finished(conn, few)
        at_few = lifecycle_calls(conn)
        # The same claim once `unvacuumed` more runs have ended with no vacuum since (held off
        # for the fill, so the figure does not depend on when autovacuum wakes).
        conn.execute("ALTER TABLE runrow.agent_run SET (autovacuum_enabled = false)")
        try:
            fill_finished(conn, unvacuumed, vacuum=False)
            before_vacuum = lifecycle_calls(conn)["claim"]
        finally:
            conn.execute("ALTER TABLE runrow.agent_run RESET (autovacuum_enabled)")
        vacuum_analyze(conn)
        fill_finished(conn, many - few - unvacuumed)
        at_many = lifecycle_calls(conn)
    return {
        "sizes": {"blocked": blocked, "few": few, "many": many, "unvacuumed": unvacuumed},
        "empty claim": {"no queued turn": empty, "blocked": behind, "vacuumed": vacuumed, "first": first},
        "at few": at_few,
        "at many": at_many,
        "claim before vacuum": before_vacuum,
    }


async def bench(url: str, short: bool = False) -> list[str]:
    return report(measure(url, short))


def report(f: dict[str, Any]) -> list[str]:
    size, empty, at_few, at_many = f["sizes"], f["empty claim"], f["at few"], f["at many"]
    before_vacuum = f["claim before vacuum"]
    per_thousand = (before_vacuum - at_few["claim"]) * 1000 / size["unvacuumed"]
    return [
        "shared buffers per call (EXPLAIN ANALYZE BUFFERS, rolled back)",
        f"  empty claim: {empty['no queued turn']} with no queued turn, {empty['blocked']} with"
        f" {size['blocked']:,} blocked queued turns ({empty['vacuumed']} after VACUUM; the first empty"
        f" claim after they arrived: {empty['first']})",
        *(
            f"  {call}: {at_few[call]} with {size['few']:,} finished runs, {at_many[call]} with"
            f" {size['many']:,} ({at_many[call] / at_few[call]:.2f}x)"
            for call in at_few
        ),
        f"  claim: {at_few['claim']} right after a vacuum, {before_vacuum} with {size['unvacuumed']:,} runs"
        f" ended since the last one ({per_thousand:.1f} more per 1,000)",
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli(
        "bench.claim_buffers",
        "What a claim and a finish cost the database in shared buffers (EXPLAIN ANALYZE BUFFERS, "
        "rolled back): an empty claim behind blocked turns, and a claim, heartbeat, append and "
        "finish with few and with many finished runs in the tables.",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help=f"small sizes: 5,000 finished runs instead of {MANY:,} (about an hour to fill), "
        f"1,000 blocked turns instead of {BLOCKED:,}",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.json is None:
        run_alone("claim_buffers", lambda url: bench(url, args.short))
        return
    with bench_database("claim_buffers") as url:
        figures = measure(url, args.short)
    print("\n".join(report(figures)))
    with open(args.json, "w") as out:
        json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
