"""JSON read from PostgreSQL so that it can be written out again as JSON.

jsonb keeps any number exactly; Python reads one past the float range (`1` followed by 400
zeros) as inf, and json.dumps writes inf as `Infinity`, which is not JSON. The web audit: a
run whose journal held such a number (a writer other than the Python worker, which cannot
store one) broke its event stream (the chat page reconnected forever on a frame it could not
parse) and made `GET /approvals` a 500 for its tool call's arguments. Read here, such a
number stays its decimal text, a JSON string on the way out: valid, and exact; JavaScript
would have read the number itself as Infinity anyway.
"""

from __future__ import annotations

import json
import math
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import set_json_loads


def loads(data: str | bytes) -> Any:
    """json.loads, a number beyond the float range kept as its text."""
    return json.loads(data, parse_float=_number)


def _number(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else text


async def configure(conn: AsyncConnection[Any]) -> None:
    """A pool's `configure`: this connection's json and jsonb values are read by `loads`."""
    set_json_loads(loads, conn)
