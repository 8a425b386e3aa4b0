# runrow — the two commands a newcomer needs are `make demo` and `make test`.
# Everything else here is what they are made of.

VENV    := .venv
BIN     := $(VENV)/bin
RUNROW  := $(BIN)/runrow

.PHONY: bootstrap demo test lint format test-in-db pgtap pytest install-sql check-install-sql db-start db-stop bench chaos failover clean

bootstrap:
	@scripts/bootstrap.sh

## The live demo on a throwaway database (issue 5).
demo: bootstrap
	$(RUNROW) demo

## Every test: lint, then pgTAP and pytest against a private throwaway PostgreSQL
## (or against DATABASE_URL when it is set).
# The chat page's browser test needs Debian's chromium, the short failover etcd and Patroni:
# bootstrap installs them for `make test`.
test: export RUNROW_WITH_BROWSER = 1
test: export RUNROW_WITH_VALGRIND = 1
test: export RUNROW_WITH_HA = 1
test: bootstrap lint check-install-sql
	$(RUNROW) db run -- $(MAKE) --no-print-directory test-in-db

test-in-db:
	$(RUNROW) migrate
	$(MAKE) --no-print-directory pgtap
	$(MAKE) --no-print-directory pytest

pgtap:
	scripts/pgtap.sh

# Two processes (pytest-xdist, one database each: tests/conftest.py), whole files to one process
# so module fixtures stay shared; the slowest tests are listed at the end.
PYTEST_JOBS ?= 2
pytest:
	$(BIN)/pytest -q -n $(PYTEST_JOBS) --dist loadfile --durations=25 $(PYTEST_ARGS)

lint:
	$(BIN)/sqlfluff lint functions migrations sql
	$(BIN)/ruff check pyworker tests bench
	$(BIN)/ruff format --check pyworker tests bench

format:
	$(BIN)/sqlfluff fix -f functions migrations sql
	$(BIN)/ruff format pyworker tests bench
	$(BIN)/ruff check --fix pyworker tests bench

install-sql:
	$(BIN)/python -m pyworker.db.installsql

check-install-sql:
	$(BIN)/python -m pyworker.db.installsql --check

db-start:
	$(RUNROW) db start

db-stop:
	$(RUNROW) db stop

## Every benchmark, then the drain against PgQueuer on a private fsync-on cluster (about two
## hours on 2 cores; BENCH_ARGS=--short for a quick pass), then the backend's instructions per run under
## callgrind (installs valgrind). Writes bench-results.json.
BENCH_ARGS ?=
bench: export RUNROW_WITH_VALGRIND = 1
bench: bootstrap
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	$(RUNROW) db run -- $(BIN)/python -m bench $(BENCH_ARGS)

## Minutes of random SIGKILL / SIGSTOP / SIGTERM over 4 workers; prints a summary, exit 1 on a violation.
CHAOS_ARGS ?= --duration 180 --workers 4 --runs 400
chaos: bootstrap
	$(RUNROW) db run -- $(BIN)/python tests/chaos.py $(CHAOS_ARGS)

## SIGKILL of the primary under load on a local Patroni cluster (etcd, 2 synchronous members):
## nothing acknowledged is lost; prints the failover timings. Installs etcd-server and the `ha` extra.
## Runs the full size (120 runs) and the short one (24) that `make test` runs too.
failover: export RUNROW_WITH_HA = 1
failover:
	@scripts/bootstrap.sh
	RUNROW_FAILOVER=1 $(BIN)/pytest -q -s tests/test_failover.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .runrow .pytest_cache .ruff_cache
