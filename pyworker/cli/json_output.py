"""`--json` of the read commands (`status`, `audit`, the `show` actions): one JSON document on
stdout, for scripts and monitoring. Its keys are the views' column names; the encoding of a
value depends only on its type (and, for numeric, on whether the column holds money), so a
script can rely on it:

- money (cost, cost_per_day, cost_budget, spent_cost, the *_per_mtok and *_per_request prices)
  is a string holding the exact decimal ("0.3", "25"): a float would round it;
- every other number is a JSON number (token counts, bucket levels);
- a timestamp is ISO 8601 with its offset ("2026-12-07T17:20:45.894043+00:00");
- an interval (an age, a time left) is a number of seconds;
- a UUID is its string, NULL is null.

Non-ASCII and control characters are \\u escapes (json.dumps' default), so the document is safe
on a terminal too."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

# The numeric columns that hold USD.
_MONEY = re.compile(r"(^|_)cost($|_)|_per_mtok$|_per_request$")

JSON_HELP = (
    "print one JSON document instead of tables: keys are the column names, money is an exact "
    "decimal string, other numbers are numbers, timestamps ISO 8601, intervals seconds"
)


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def value(name: str, v: Any) -> Any:
    """`v`, a value psycopg read from column `name`, as the JSON document holds it."""
    if isinstance(v, bool) or v is None or isinstance(v, str | int | float):
        return v
    if isinstance(v, Decimal):
        if _MONEY.search(name) or not v.is_finite():
            return format(v, "f")  # positional, never 1E-7
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, UUID):
        return str(v)
    if isinstance(v, Mapping):
        return {str(k): value(str(k), x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [value(name, x) for x in v]
    return str(v)


def row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A row (column name to value) as a JSON object."""
    return {n: value(n, v) for n, v in r.items()}


def emit(document: Mapping[str, Any]) -> None:
    """The command's one document, on stdout."""
    print(json.dumps(document, allow_nan=False), file=sys.stdout)
