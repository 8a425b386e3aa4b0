"""The nul-percent encoding (pyworker/db/nul.py): what the worker writes to jsonb when a string holds
U+0000. Lossless for any value, a no-op without a NUL, storable by PostgreSQL's jsonb, and the
chat page's decoder (pyworker/http/web/app.js) reads it back exactly as Python's does."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worker_support import REPO

from pyworker.db import nul

# Text that stresses the scheme: NULs, percent signs, and the encoded sequences themselves.
text = st.text(
    alphabet=st.sampled_from(["\x00", "%", "0", "2", "5", "a", "é", "\\", "u"]), max_size=12
) | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
)
events = st.dictionaries(text.filter(lambda k: k != nul.MARKER), json_values, max_size=5).map(
    lambda d: {"type": "text_delta", **d}
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_encoding_is_lossless_and_a_no_op_without_a_nul(event: dict[str, Any]) -> None:
    encoded = nul.encode(event)
    assert nul.decode(encoded) == event
    assert not nul.has_nul(encoded)
    if not nul.has_nul(event):
        assert encoded is event
    else:
        assert encoded[nul.MARKER] == nul.SCHEME
    # Nested, as a complete event carries the run's result.
    assert nul.decode({"type": "complete", "result": encoded}) == {"type": "complete", "result": event}


def test_jsonb_stores_the_encoded_form(database_url: str) -> None:
    event = {"type": "text_delta", "text": "a\x00b 100% %00", "k\x00": ["\x00"]}
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            conn.execute("SELECT %s::jsonb", (json.dumps(event),))
        stored = conn.execute("SELECT %s::jsonb", (json.dumps(nul.encode(event)),)).fetchone()
    assert stored is not None and nul.decode(stored[0]) == event


def _page_decoder() -> str:
    source = (REPO / "pyworker" / "http" / "web" / "app.js").read_text()
    match = re.search(r"^function decodeNul\(.*?^\}\n", source, re.S | re.M)
    assert match, "app.js has no decodeNul function"
    return match.group(0)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_chat_pages_decoder_agrees_with_pythons() -> None:
    cases = [
        {"type": "text_delta", "index": 0, "text": "Before\x00after 100% %00 %25 \\u0000"},
        {"type": "complete", "status": "completed", "result": {"text": "a\x00%", "stop_reason": "end_turn"}},
        {"type": "tool_call", "tool": "x", "nested": {"k\x00": ["%", "\x00", 1, None, True]}},
        {"type": "text_delta", "text": "no NUL, 100% as is: %00"},
    ]
    encoded = [
        {**c, "result": nul.encode(c["result"])} if c["type"] == "complete" else nul.encode(c) for c in cases
    ]
    script = _page_decoder() + "\nconst input = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n"
    script += "process.stdout.write(JSON.stringify(input.map((v) => decodeNul(v))));\n"
    out = subprocess.run(
        ["node", "-e", script],
        input=json.dumps(encoded),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert json.loads(out.stdout) == cases


@settings(max_examples=300, deadline=None)
@given(events)
def test_encode_sized_is_encode_and_its_json_length(event: dict[str, Any]) -> None:
    encoded, size = nul.encode_sized(event)
    assert encoded == nul.encode(event)
    assert size == len(json.dumps(nul.encode(event)))
    if not nul.has_nul(event):
        assert encoded is event


def test_encode_sized_walks_only_what_its_json_shows_a_nul_in() -> None:
    # A backslash before "u0000" shows the same escape in the JSON text without a NUL: walked,
    # found clean, returned as is.
    literal = {"type": "text_delta", "text": "\\u0000 is how JSON writes a NUL"}
    assert nul.encode_sized(literal) == (literal, len(json.dumps(literal)))
    assert nul.encode_sized(literal)[0] is literal
    real = {"type": "text_delta", "text": "a\x00b"}
    encoded, size = nul.encode_sized(real)
    assert encoded == {"type": "text_delta", "text": "a%00b", nul.MARKER: nul.SCHEME}
    assert size == len(json.dumps(encoded))
