"""Where journal rows written after a VACUUM go (migration 0060).

VACUUM records in the free space map the free space at the end of every journal page, a
few hundred bytes each once the enqueue's rows have filled it. A later row small enough for
one of those tails went there: to a page nobody had touched since the last checkpoint, which
PostgreSQL then logs whole (a full-page image, 8 kB for a row of about 150 bytes). With the
journal's pages filled to 95%, a page is offered for a row only when it has room for the row
and the reserve, so later rows go to the table's end. bench/wal_history.py counts the images;
this test counts the pages, which do not depend on when the last checkpoint was.
"""

from __future__ import annotations

import psycopg
from race_support import database_url, owner

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

RUNS = 400


def test_rows_written_after_a_vacuum_do_not_fill_the_tails_of_older_pages(owner: psycopg.Connection) -> None:
    owner.execute(
        "SELECT runrow.enqueue_run(gen_random_uuid(), '\"job\"', 'layout-probe') FROM generate_series(1, %s)",
        (RUNS,),
    )
    owner.execute("VACUUM runrow.run_event")
    (pages,) = owner.execute(
        "SELECT pg_relation_size('runrow.run_event') / current_setting('block_size')::int"
    ).fetchone()
    assert pages >= 10  # the enqueue's rows (two a run) fill many pages, each with a tail
    runs = owner.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('layout-probe', %s, 30)", (RUNS,)
    ).fetchall()
    assert len(runs) == RUNS
    acks = [{"run_id": str(r), "claim_token": str(t), "status": "completed"} for r, t in runs]
    finished = owner.execute(
        "SELECT finished FROM runrow.finish_runs(%s::jsonb)", (psycopg.types.json.Jsonb(acks),)
    ).fetchall()
    assert all(f for (f,) in finished)
    # The pages the claim's and the finish's rows went to, among those the enqueue had filled.
    (older,) = owner.execute(
        "SELECT count(DISTINCT (ctid::text::point)[0]) FROM runrow.run_event"
        " WHERE type IN ('run_claimed', 'complete') AND (ctid::text::point)[0] < %s - 1",
        (pages,),
    ).fetchone()
    assert older == 0, f"{older} of the {pages} pages the enqueue filled took a later row into their tail"
