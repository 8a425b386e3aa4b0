"""Where the SQL lives, relative to the installed package or the source checkout."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
MIGRATIONS_DIR = ROOT / "migrations"
FUNCTIONS_DIR = ROOT / "functions"
SQL_DIR = ROOT / "sql"
INSTALL_SQL = SQL_DIR / "install.sql"
