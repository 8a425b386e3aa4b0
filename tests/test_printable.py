"""pyworker.db.printable mirrors runrow._printable (functions/_identifier_checks.sql): the
service refuses at the door exactly what the schema refuses, code point by code point."""

from __future__ import annotations

import psycopg

from pyworker.db.printable import NOT_PRINTABLE, first_hidden


def test_the_python_class_is_the_schemas(database_url: str) -> None:
    # Every code point of the Basic Multilingual Plane but the surrogates (not text in either).
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT c.cp FROM generate_series(1, 65533) AS c (cp) "
            "WHERE c.cp NOT BETWEEN 55296 AND 57343 AND NOT runrow._printable(chr(c.cp))"
        ).fetchall()
    refused_by_sql = {cp for (cp,) in rows}
    refused_here = {
        cp for cp in range(1, 65534) if not 0xD800 <= cp <= 0xDFFF and NOT_PRINTABLE.match(chr(cp))
    }
    assert refused_here == refused_by_sql
    assert len(refused_by_sql) == 31 + 33 + 2 + 3 + 5 + 4


def test_first_hidden_names_the_character_by_code_point_and_place() -> None:
    assert first_hidden("acme") is None
    assert first_hidden("ab\u202ecd\n") == "U+202E at character 3"
