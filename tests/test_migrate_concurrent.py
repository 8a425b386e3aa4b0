"""Two databases of one cluster migrated at the same moment (a fleet's deploy job per
tenant database, or this suite's own xdist workers) both create runrow's cluster-wide
roles. The existence check cannot see a role another session created and has not
committed, so the loser's CREATE ROLE waits for it and then hits the unique index.

The interleaving is forced on a private cluster (its roles start absent): a superuser
session creates runrow_worker and holds the transaction open while `migrate` runs; once
the migration waits on it, the session commits.
"""

from __future__ import annotations

import threading

import psycopg

from pyworker.db import devdb
from pyworker.db.migrate import migrate


def test_a_migration_that_races_another_for_the_roles_still_installs():
    with devdb.throwaway() as cluster:
        with psycopg.connect(cluster.superuser_url, autocommit=True) as observer:
            holder = psycopg.connect(cluster.superuser_url)
            holder.execute("CREATE ROLE runrow_worker NOLOGIN")
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    migrate(cluster.url)
                except BaseException as error:  # handed to the main thread, asserted below
                    errors.append(error)

            migrating = threading.Thread(target=run)
            migrating.start()
            for _ in range(600):
                (waiting,) = observer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
                    (holder.info.backend_pid,),
                ).fetchone()
                if waiting or not migrating.is_alive():
                    break
                migrating.join(0.05)
            assert waiting == 1, "the migration never waited on the uncommitted role"
            holder.commit()
            holder.close()
            migrating.join(60)
            assert not migrating.is_alive()
            assert errors == []
            roles = observer.execute(
                "SELECT array_agg(rolname ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'runrow\\_%'"
            ).fetchone()[0]
            assert {"runrow_auditor", "runrow_client", "runrow_worker"} <= set(roles)
            assert observer.execute(
                "SELECT to_regprocedure('runrow.claim_runs(text,integer,integer)')"
            ).fetchone()[0]
