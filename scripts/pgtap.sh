#!/usr/bin/env bash
# Run every pgTAP file under pgtap/ with pg_prove. Tests need to SET ROLE to the runrow
# roles, so they connect as the superuser of the throwaway cluster when there is one
# (RUNROW_SUPERUSER_URL), else as DATABASE_URL (which must then be a member of the roles
# or a superuser, and have the pgtap extension available).
set -euo pipefail
cd "$(dirname "$0")/.."
url=${RUNROW_SUPERUSER_URL:-${DATABASE_URL:?set DATABASE_URL or run through runrow db run}}
psql "$url" -v ON_ERROR_STOP=1 -q -c "SET client_min_messages = warning" -c "CREATE SCHEMA IF NOT EXISTS tap" \
  -c "CREATE EXTENSION IF NOT EXISTS pgtap SCHEMA tap" >/dev/null
# pg_prove hands psql a database *name*, not a URI, so pass the URL as libpq variables.
eval "$(.venv/bin/python - "$url" <<'PY'
import shlex, sys
from psycopg.conninfo import conninfo_to_dict
for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"),
                 ("dbname", "PGDATABASE"), ("password", "PGPASSWORD")):
    value = conninfo_to_dict(sys.argv[1]).get(key)
    if value is not None:
        print(f"export {var}={shlex.quote(str(value))}")
PY
)"
exec pg_prove --ext .sql --recurse ${PGTAP_ARGS:-} pgtap/
