"""What `runrow migrate` prints: one summary line, the migrations one by one only at DEBUG."""

from __future__ import annotations

import re

from test_cli import runrow

from pyworker.db.devdb import temporary_database
from pyworker.db.schema import required_version, shipped_migrations


def test_a_new_database_gets_one_line_and_debug_gets_each(database_url: str) -> None:
    """It logged an INFO line for each of 86 migrations, then listed them all again on one line."""
    with temporary_database(database_url, "runrow_migrate_out", migrated=False) as url:
        done = runrow(url, "migrate")
        assert done.returncode == 0, done.stderr
        assert "applied migration" not in done.stderr, done.stderr[:400]
        assert len(done.stderr.splitlines()) <= 2, done.stderr[:400]  # a notice or two, not 86 lines
        version = required_version()
        count = len(shipped_migrations())  # not the newest number: numbers may be skipped
        assert done.stdout.splitlines() == [
            f"applied {count} migrations (0001…{version[:4]}) and "
            f"{_functions(done.stdout)} function files; schema at {version}"
        ]
        again = runrow(url, "migrate")
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == [
            f"schema at {version}: up to date, no migration to apply "
            f"({_functions(again.stdout)} function files re-applied)"
        ]
    with temporary_database(database_url, "runrow_migrate_debug", migrated=False) as url:
        debug = runrow(url, "--log-level", "DEBUG", "migrate")
        assert debug.returncode == 0, debug.stderr
        assert len(re.findall(r"DEBUG runrow\.migrate applied migration \d{4}_", debug.stderr)) == count


def _functions(stdout: str) -> int:
    found = re.search(r"(\d+) function files", stdout)
    assert found is not None, stdout
    return int(found.group(1))


def test_the_summary_names_the_span() -> None:
    from pyworker.cli.main import migrate_summary

    assert migrate_summary(["0087_a"], 70, "0087_a") == (
        "applied 1 migration (0087) and 70 function files; schema at 0087_a"
    )
    assert migrate_summary(["0084_a", "0086_c", "0085_b"], 69, "0086_c") == (
        "applied 3 migrations (0084…0086) and 69 function files; schema at 0086_c"
    )  # the span by number, whatever order the dependencies applied them in
