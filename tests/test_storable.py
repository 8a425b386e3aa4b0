"""pyworker.db.storable: the one walk that finds what jsonb cannot store in what json.loads read."""

from __future__ import annotations

import json

import pytest

from pyworker.db.storable import Fault, Unstorable, find_unstorable


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": [1, "x", {"b": null}]}', None),
        ('{"a": {"b": "\\u0000"}}', Unstorable(Fault.NUL, "m.a.b")),
        ('{"a": ["ok", "\\ud800"]}', Unstorable(Fault.SURROGATE, "m.a[1]")),
        ('{"a": {"\\u0000k": 1}}', Unstorable(Fault.NUL, "m.a", in_key=True)),
        ('{"a": [1e999]}', Unstorable(Fault.NOT_FINITE, "m.a[0]")),
        ('{"a": -1e999}', Unstorable(Fault.NOT_FINITE, "m.a")),
        # Depth first, in order: the first fault is the one named.
        ('{"a": "\\u0000", "b": 1e999}', Unstorable(Fault.NUL, "m.a")),
    ],
)
def test_the_first_unstorable_thing_is_named_by_its_path(text: str, expected: Unstorable | None) -> None:
    assert find_unstorable(json.loads(text), "m") == expected


def test_depth_is_counted_only_when_asked() -> None:
    deep = json.loads("[" * 5 + "]" * 5)
    assert find_unstorable(deep, "m") is None
    assert find_unstorable(deep, "m", max_depth=5) is None
    assert find_unstorable(deep, "m", max_depth=4) == Unstorable(Fault.TOO_DEEP, "m[0][0][0][0]")


def test_long_keys_are_shortened_in_the_path() -> None:
    found = find_unstorable({"k" * 100: "\x00"}, "m")
    assert found is not None and found.path == "m." + "k" * 39 + "…"
