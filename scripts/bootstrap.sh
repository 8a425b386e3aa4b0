#!/usr/bin/env bash
# Install what runrow needs on a fresh Debian machine with nothing but Python and apt:
# PostgreSQL 15 + pgTAP + pg_prove, pgbouncer and faketime for the fault tests, Node.js and npm
# for the second-language test (apt, when
# missing and permitted), then a venv with
# the project and its dev tools. Idempotent and quick when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -x /usr/lib/postgresql/15/bin/initdb ] || need_apt+=(postgresql-15)
[ -f /usr/share/postgresql/15/extension/pgtap.control ] || need_apt+=(postgresql-15-pgtap)
command -v pg_prove >/dev/null 2>&1 || need_apt+=(libtap-parser-sourcehandler-pgtap-perl)
command -v psql >/dev/null 2>&1 || need_apt+=(postgresql-client-15)
# The fault tests: a real transaction pooler, and libfaketime for a worker with a skewed clock.
[ -x /usr/sbin/pgbouncer ] || need_apt+=(pgbouncer)
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
# The second-language test (tests/test_node_worker.py): examples/node runs on Node.js with npm's pg.
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ "${RUNROW_WITH_BROWSER:-0}" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
fi
# `make test` and `make bench` count the backend's instructions per run under callgrind
# (bench/instructions.py).
if [ "${RUNROW_WITH_VALGRIND:-0}" = 1 ]; then
  command -v valgrind >/dev/null 2>&1 || need_apt+=(valgrind)
  # tests/test_bench_client_instructions.py takes the ptrace slot to show the count needs none.
  command -v strace >/dev/null 2>&1 || need_apt+=(strace)
fi
# The failover tests (`make test` runs the short one, `make failover` both) need a DCS for Patroni.
if [ "${RUNROW_WITH_HA:-0}" = 1 ]; then
  command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; else
    echo "bootstrap: missing Debian packages: ${need_apt[*]}" >&2
    echo "bootstrap: install them with: sudo apt-get install -y ${need_apt[*]}" >&2
    echo "bootstrap: (or set DATABASE_URL to an existing PostgreSQL 15 with pgTAP)" >&2
    exit 1
  fi
  echo "bootstrap: apt-get install ${need_apt[*]}"
  # The Debian server package would start a system cluster on 5432; we never use it.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # Another apt on the machine holds the dpkg lock for a while: wait for it rather than fail.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${need_apt[@]}" >/dev/null
  # Debian's pgbouncer package starts a system pgbouncer on 6432; the tests start their own.
  if [[ " ${need_apt[*]} " == *" pgbouncer "* ]] && [ -x /etc/init.d/pgbouncer ]; then
    $sudo /etc/init.d/pgbouncer stop >/dev/null 2>&1 || true
  fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$PYTHON" -m venv .venv
fi
# bench: PgQueuer and asyncpg, the drain's peer, so `make test` can run the drain's short check.
extras=dev,bench
stamp=.venv/.runrow-installed
if [ "${RUNROW_WITH_HA:-0}" = 1 ]; then
  extras=dev,bench,ha
  stamp=.venv/.runrow-installed-ha
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: pip install -e '.[$extras]'"
  log=.venv/pip-install.log
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e ".[$extras]"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "bootstrap: pip install failed (log above, also in $log)" >&2
    exit 1
  fi
  touch "$stamp"
fi

# examples/node's dependencies, from its lock file; without them the Node test installs them itself.
if command -v npm >/dev/null 2>&1 && [ ! -d examples/node/node_modules/pg ]; then
  echo "bootstrap: npm ci in examples/node"
  (cd examples/node && npm ci --no-audit --no-fund --silent) ||
    echo "bootstrap: npm ci failed; tests/test_node_worker.py will try npm install" >&2
fi
