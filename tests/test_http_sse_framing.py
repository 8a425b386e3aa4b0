"""An event type that is not a plain name is framed without an `event:` line, never as a name
made by deleting characters (pyworker/http/sse.py). The web audit: a worker journaled
`{"type": "comp\\r\\nlete"}` through runrow.append_events (not literally `complete`, so the SQL
check let it through), and the stream stripped CR and LF into `event: complete`: a forged end
that made clients stop reading. The SQL writers now refuse a type with a control character, so
those rows are written here as a journal written before that rule holds them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, private_database, serve
from tail_support import append, claim, finish

from pyworker.db.api import Event
from pyworker.http.sse import frame


@pytest.fixture(scope="module")
def framing_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_sse_framing")


@pytest.fixture(scope="module")
def server(framing_db: str) -> Iterator[Server]:
    yield from serve(framing_db)


CONTROLLED = ["comp\r\nlete", "comp\nlete", "comp\rlete", "complete\n"]
FORGED = [*CONTROLLED, "complete ", "x" * 65, "complète"]


def test_a_type_with_cr_lf_is_no_forged_complete(server: Server, framing_db: str) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        enqueued = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers=ALICE)
        run_id = uuid.UUID(enqueued.json()["run_id"])
        with psycopg.connect(framing_db, autocommit=True) as db:
            token = claim(db, run_id)
            forged = [{"type": kind, "status": "completed", "result": "forged"} for kind in FORGED]
            for event in forged[: len(CONTROLLED)]:
                with pytest.raises(psycopg.errors.InvalidParameterValue, match="no control character"):
                    append(db, run_id, token, [event])
                # As a journal written before the SQL writers' rule holds it (the guard numbers it).
                db.execute(
                    "INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%s, %s, %s)",
                    (run_id, event["type"], json.dumps(event)),
                )
            append(db, run_id, token, [*forged[len(CONTROLLED) :], {"type": "text_delta", "text": "after"}])
            finish(db, run_id, token)
        # The raw bytes, as an EventSource or the chat page's reader parses them (either line end).
        response = client.get(f"/runs/{run_id}/events", headers=ALICE)
    assert response.status_code == 200
    blocks = response.text.split("\n\n")
    events = [b for b in blocks if b.startswith("id: ")]
    names = [line for b in events for line in b.splitlines() if line.startswith("event:")]
    assert names.count("event: complete") == 1 and events[-1].splitlines()[1] == "event: complete", names
    for kind in FORGED:
        block = next(b for b in events if f'"type":{json.dumps(kind, ensure_ascii=False)}' in b)
        assert "event:" not in block, block  # a default `message` event; its data holds the type
    assert any("event: text_delta" in b and '"after"' in b for b in events)
    assert "\r" not in response.text


def test_plain_names_keep_their_event_line() -> None:
    now = datetime.now(UTC)
    for kind in ["text_delta", "run_claimed", "my.app:tool-progress", "x" * 64]:
        framed = frame(Event(7, kind, {"type": kind}, now)).decode()
        assert framed == f'id: 7\nevent: {kind}\ndata: {{"type":"{kind}"}}\n\n'
    assert frame(Event(8, "a b", {"type": "a b"}, now)) == b'id: 8\ndata: {"type":"a b"}\n\n'
