"""bench/floor.py's rungs, small: each drains its runs through its one statement and passes its
check; the check catches a run left over, claimed twice or with a gap in its journal; the
statement's fence holds; each rung on runrow's tables runs with its triggers as it says. The
functions row (runrow's functions, its rule triggers off) drains, keeps the fence, has exactly
those two triggers off, and refuses to run once functions/ no longer has what it rewrites."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

from pyworker.db.devdb import temporary_database

ROOT = Path(__file__).resolve().parent.parent
NARROW, TABLES, TRIGGERS, FUNCTIONS = (
    "runrow floor (narrow table)",
    "runrow floor (its tables, no triggers)",
    "runrow floor (its tables and triggers)",
    "runrow floor (its functions, no rule triggers)",
)
RUNGS = (NARROW, TABLES, TRIGGERS)
Acks = Callable[[list[tuple[object, object]]], str]


@pytest.fixture
def floor_database(database_url: str) -> Iterator[str]:
    """A migrated database of its own, as bench.drain gives each row (a copy of the template)."""
    with temporary_database(database_url, "runrow_floor") as url:
        yield url


@pytest.fixture
def floor(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is the repository's, not the package's
    from bench import floor

    assert (floor.NARROW, floor.TABLES, floor.TRIGGERS) == RUNGS
    assert floor.FUNCTIONS == FUNCTIONS
    assert list(floor.systems()) == [*RUNGS, FUNCTIONS]
    return floor


@pytest.fixture
def acks(floor: ModuleType) -> Acks:
    """The endings' JSON, as the floor's worker writes it (bench.drain's, for finish_runs)."""
    from bench.drain import acks

    return acks


@pytest.mark.parametrize("rung", RUNGS)
@pytest.mark.parametrize("batch", [1, 10])
def test_a_rung_drains_every_run_once_with_a_whole_journal(
    floor: ModuleType, floor_database: str, rung: str, batch: int
):
    floor.setup(rung, floor_database, 25)
    assert floor.worker(rung, floor_database, batch, lambda: None) == 25
    floor.check(rung, floor_database, 25)


@pytest.mark.parametrize("rung", RUNGS)
def test_the_check_fails_while_runs_are_left(floor: ModuleType, floor_database: str, rung: str):
    floor.setup(rung, floor_database, 3)
    with pytest.raises(AssertionError, match="0 of 3 runs"):
        floor.check(rung, floor_database, 3)


@pytest.mark.parametrize(
    "damage",
    [
        "DELETE FROM run_event WHERE run_id = 2 AND seq = 2",  # a gap
        "UPDATE run SET attempt = 2 WHERE id = 2",  # claimed twice
        "DELETE FROM run_event WHERE run_id = 2 AND type = 'complete'",  # no complete
    ],
)
def test_the_check_fails_on_a_damaged_run(floor: ModuleType, floor_database: str, damage: str):
    floor.setup(NARROW, floor_database, 3)
    floor.worker(NARROW, floor_database, 10, lambda: None)
    with psycopg.connect(floor_database, autocommit=True) as conn:
        conn.execute(damage)
    with pytest.raises(AssertionError, match="2 of 3 runs"):
        floor.check(NARROW, floor_database, 3)


@pytest.mark.parametrize("rung", RUNGS)
def test_an_ending_with_a_wrong_token_writes_nothing(
    floor: ModuleType, acks: Acks, floor_database: str, rung: str
):
    floor.setup(rung, floor_database, 1)
    with psycopg.connect(floor_database, autocommit=True) as conn:
        ((run_id, token),) = conn.execute(floor.call(rung), {"acks": "[]", "batch": 1}).fetchall()
        forged = acks([(run_id, uuid.uuid4())])
        assert conn.execute(floor.call(rung), {"acks": forged, "batch": 1}).fetchall() == []
        run, event = floor.tables(rung)
        status = conn.execute(f"SELECT status FROM {run} WHERE id = %s", (run_id,)).fetchone()
        completes = conn.execute(
            f"SELECT count(*) FROM {event} WHERE run_id = %s AND type = 'complete'", (run_id,)
        ).fetchone()
        assert (status, completes) == (("running",), (0,))
        conn.execute(floor.call(rung), {"acks": acks([(run_id, token)]), "batch": 1})
    floor.check(rung, floor_database, 1)


def disabled_triggers(url: str) -> tuple[list[tuple[str, str]], int]:
    """The user triggers of agent_run and run_event that are off, and how many there are in all."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tgrelid::regclass::text, tgname, tgenabled = 'D' FROM pg_trigger"
            " WHERE tgrelid IN ('runrow.agent_run'::regclass, 'runrow.run_event'::regclass)"
            " AND NOT tgisinternal ORDER BY 1, 2"
        ).fetchall()
    return [(table, name) for table, name, off in rows if off], len(rows)


@pytest.mark.parametrize(("rung", "enabled"), [(TABLES, False), (TRIGGERS, True)])
def test_the_rungs_on_runrows_tables_run_with_their_triggers_as_named(
    floor: ModuleType, floor_database: str, rung: str, enabled: bool
):
    floor.setup(rung, floor_database, 1)
    off, total = disabled_triggers(floor_database)
    assert total > 0 and len(off) == (0 if enabled else total)


@pytest.mark.parametrize("rung", RUNGS)
def test_a_rungs_statement_is_planned_once_with_index_lookups(
    floor: ModuleType, acks: Acks, floor_database: str, rung: str
):
    """Planned per call, a rung would pay the planner for agent_run's partial indexes, which
    runrow's functions do not; planned generically without the session's settings, the claim
    hash-joined a whole scan of the table."""
    floor.setup(rung, floor_database, 50)
    with psycopg.connect(floor_database, autocommit=True) as conn:
        floor.planned_once(conn)
        claimed: list[tuple[object, object]] = []
        for _ in range(3):
            params = {"acks": acks(claimed), "batch": 10}
            claimed = conn.execute(floor.call(rung), params, prepare=True).fetchall()
        ((name, generic, custom),) = conn.execute(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements"
        ).fetchall()
        assert (generic, custom) == (3, 0)
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN EXECUTE {name}('[]', 10)"))
    assert "Seq Scan" not in plan and "Hash Join" not in plan, plan


@pytest.mark.parametrize("batch", [1, 10])
def test_the_functions_row_drains_every_run_once_with_a_whole_journal(
    floor: ModuleType, floor_database: str, batch: int
):
    """With the guard off, nobody numbers the journal but the rewritten writers: a gap, a reused
    seq or a NULL one would fail the drain or its check."""
    floor.setup(FUNCTIONS, floor_database, 25)
    assert floor.functions_worker(floor_database, batch, lambda: None) == 25
    floor.check(FUNCTIONS, floor_database, 25)


def test_the_functions_row_has_exactly_its_rule_triggers_off(floor: ModuleType, floor_database: str):
    floor.setup(FUNCTIONS, floor_database, 1)
    off, total = disabled_triggers(floor_database)
    assert off == sorted(floor.RULE_TRIGGERS) and total > len(off)


def test_the_functions_row_keeps_the_fence(floor: ModuleType, acks: Acks, floor_database: str):
    floor.setup(FUNCTIONS, floor_database, 1)
    with psycopg.connect(floor_database, autocommit=True) as conn:
        ((run_id, token),) = conn.execute(
            "SELECT run_id, claim_token FROM runrow.claim_runs(worker_id => 'bench', max_runs => 1)"
        ).fetchall()
        call = "SELECT finished FROM runrow.finish_and_claim_runs(%s::jsonb, worker_id => 'bench')"
        assert conn.execute(call, (acks([(run_id, uuid.uuid4())]),)).fetchall() == [(False,)]
        status = conn.execute("SELECT status FROM runrow.agent_run WHERE id = %s", (run_id,)).fetchone()
        assert status == ("running",)
        assert conn.execute(call, (acks([(run_id, token)]),)).fetchall() == [(True,)]
    floor.check(FUNCTIONS, floor_database, 1)


def test_the_functions_row_refuses_functions_it_cannot_rewrite(
    floor: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    for name in ("_claim.sql", "finish_and_claim_runs.sql"):
        (tmp_path / name).write_text((floor.FUNCTIONS_DIR / name).read_text())
    assert len(floor.self_numbered_functions()) == 2
    monkeypatch.setattr(floor, "FUNCTIONS_DIR", tmp_path)
    assert len(floor.self_numbered_functions()) == 2
    claim = tmp_path / "_claim.sql"
    # The journal INSERT given an explicit NULL::bigint: no longer the statement it rewrites.
    changed, n = re.subn(r"NULL,(\s+'run_claimed',)", r"NULL::bigint,\1", claim.read_text())
    assert n == 1
    claim.write_text(changed)
    with pytest.raises(RuntimeError, match=r"functions/_claim\.sql has 0 matches"):
        floor.self_numbered_functions()
