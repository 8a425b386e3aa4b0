"""Generate sql/install.sql: migrations + functions in one psql script.

The script is for people who do not run Python: `psql -v ON_ERROR_STOP=1 -f
sql/install.sql` installs or upgrades everything. It keeps yoyo's bookkeeping
(`runrow._yoyo_migration` and friends) exactly as `runrow migrate` does, so the two
install paths can be mixed on one database in either order. Each migration is wrapped
in a psql `\\if` that skips it when already applied, so running the file twice in a row
succeeds, and the whole file is one transaction under the same advisory lock as
`runrow migrate`.

`python -m pyworker.db.installsql` rewrites the file; `--check` exits non-zero when the
committed file is stale (the test suite runs that).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from pyworker.db.migrate import function_files
from pyworker.db.paths import FUNCTIONS_DIR, INSTALL_SQL, MIGRATIONS_DIR, SQL_DIR
from pyworker.db.schema import migration_files

# The psql text lives in sql/templates/ (.psql: psql meta-commands, not plain SQL), so this
# module only assembles files and holds no SQL of its own.
HEADER = (SQL_DIR / "templates" / "install_header.psql").read_text()
MIGRATION_BLOCK = (SQL_DIR / "templates" / "install_migration.psql").read_text()
NEWER_GUARD = (SQL_DIR / "templates" / "install_newer_guard.psql").read_text()


def _migration_block(path: Path) -> str:
    mid = path.stem
    digest = hashlib.sha256(mid.encode()).hexdigest()  # yoyo's get_migration_hash
    body = path.read_text().rstrip() + "\n"
    return MIGRATION_BLOCK.format(mid=mid, digest=digest, var="apply_" + digest[:12], body=body)


def render(migrations_dir: Path = MIGRATIONS_DIR, functions_dir: Path = FUNCTIONS_DIR) -> str:
    paths = migration_files(migrations_dir)
    known = ",\n    ".join(f"'{path.stem}'" for path in paths)
    parts = [HEADER, NEWER_GUARD.format(known="\n    " + known + "\n")]
    for path in paths:
        parts.append(_migration_block(path))
    parts.append("\n-- functions/: re-applied on every install, like `runrow migrate`\n")
    for path in function_files(functions_dir):
        parts.append(f"\n-- functions/{path.name}\n{path.read_text().rstrip()}\n")
    parts.append("\nCOMMIT;\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if sql/install.sql is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not INSTALL_SQL.exists() or INSTALL_SQL.read_text() != text:
            print("sql/install.sql is stale: run `make install-sql` and commit it.", file=sys.stderr)
            return 1
        return 0
    INSTALL_SQL.write_text(text)
    print(f"wrote {INSTALL_SQL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
