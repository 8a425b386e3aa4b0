"""The characters no identifier may hold: runrow._printable's class, for checks made before SQL.

functions/_identifier_checks.sql is the rule (the tables refuse them too); this copy lets the HTTP
service and the CLI refuse an identifier where the user typed it, at the position they typed it,
and lets `runrow serve` refuse at start a user id every enqueue would refuse
(tests/test_printable.py holds the two classes equal, code point by code point).
"""

from __future__ import annotations

import re

# C0 (and NUL, which text cannot hold), DEL and C1, U+2028/2029, and the bidirectional formatting
# characters: U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069.
NOT_PRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def first_hidden(value: str) -> str | None:
    """None when value may be an identifier; else what names its first refused character
    ("U+202E at character 3"), never the character itself (it would reach a log as is)."""
    found = NOT_PRINTABLE.search(value)
    if found is None:
        return None
    return f"U+{ord(found.group()):04X} at character {found.start() + 1}"
