"""Webhooks through the outbox, end to end: real `runrow worker` processes deliver to a loopback
receiver (a real HTTP server in this test) that fails, hangs past the timeout and answers 500
before it succeeds. Delivered once and signed; retried with backoff; dead-lettered after N; a
worker SIGKILLed while the receiver holds its request loses nothing (another worker delivers the
same delivery id once the lease lapses). Plus the signature helper and the HTTP API's field.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import psycopg
import pytest
from http_support import ALICE, error_of, serve
from metrics_support import metrics_url, scrape, total, value
from psycopg.types.json import Jsonb
from worker_support import REPO, WorkerProcess, db, wait_until, worker_db, worker_db_superuser

from pyworker.worker import exact_json
from pyworker.worker.webhooks import (
    SignatureError,
    body_of,
    encode_body,
    redirect_error,
    signature_header,
    verify_signature,
)

__all__ = ["db", "worker_db", "worker_db_superuser"]

SECRET = "whsec_test_0123456789"
# Short clocks so the test's waits are short; the backoff doubles: 0.5 s, 1 s, 2 s, ...
FAST = ["--poll", "0.2", "--webhook-poll", "0.2", "--webhook-backoff", "0.5", "--webhook-timeout", "1"]


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when the request arrived


class Receiver:
    """A loopback HTTP server that answers each POST as its script says, in order, then 200:
    "ok" (200), "slow" (200 after 2 s), "500", "close" (drops the connection without an
    answer), "hang" (answers nothing until the test ends: the sender must time out), "hold"
    (the same; the test kills the sender meanwhile). A 3xx comes with `Location: self.location`."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.location = "http://127.0.0.1:9/moved"
        self.requests: list[Received] = []
        self.done = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    n = len(receiver.requests)
                    receiver.requests.append(Received(dict(self.headers.items()), body, time.monotonic()))
                action = receiver.script[n] if n < len(receiver.script) else "ok"
                if self.path.endswith("/hang"):  # this URL's every request, whatever the script
                    action = "hang"
                if action in ("hang", "hold"):
                    receiver.done.wait(60)
                    return
                if action == "slow":  # 200, two seconds after the request came
                    receiver.done.wait(2)
                    action = "ok"
                if action == "close":
                    self.close_connection = True
                    return
                code = 200 if action == "ok" else int(action)
                self.send_response(code)
                if 300 <= code < 400:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/runrow"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def close(self) -> None:
        self.done.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    r = Receiver(getattr(request, "param", []))
    yield r
    r.close()


@pytest.fixture
def workers(worker_db: str) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def _start(
        name: str, *args: str, env: dict[str, str] | None = None, allow_private: bool = True
    ) -> WorkerProcess:
        # The receivers here are on the loopback interface, which the sender reaches only when
        # allowed (tests/test_webhook_public_only.py starts one without).
        flags = ["--allow-private-webhooks"] if allow_private else []
        w = WorkerProcess(
            worker_db, name, [*flags, *args], env={"RUNROW_WEBHOOK_SECRET": SECRET, **(env or {})}
        )
        started.append(w)
        w.wait_started()
        w.wait_log("webhook delivery on")
        return w

    yield _start
    for w in started:
        w.close()


def enqueue_hooked(db: psycopg.Connection, url: str) -> uuid.UUID:
    row = db.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => %s, model => 'echo', "
        "metadata => %s, webhook_url => %s)",
        (uuid.uuid4(), Jsonb("hi"), Jsonb({"echo": "hello", "duration": 0.05}), url),
    ).fetchone()
    assert row is not None
    return row[0]


def delivery(db: psycopg.Connection, run_id: uuid.UUID) -> dict[str, Any]:
    cur = db.execute(
        "SELECT id, state, attempts, worker_id, last_error, last_http_status, payload "
        "FROM runrow.webhook_delivery WHERE run_id = %s",
        (run_id,),
    )
    row = cur.fetchone()
    assert row is not None, f"no delivery for run {run_id}"
    return dict(zip([c.name for c in cur.description or ()], row, strict=True))


def state(db: psycopg.Connection, run_id: uuid.UUID) -> str | None:
    """The delivery's state; None while the run has not ended (no delivery yet)."""
    row = db.execute("SELECT state FROM runrow.webhook_delivery WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else row[0]


def check_signed(r: Received, body: bytes | None = None) -> None:
    verify_signature(SECRET, r.headers.get("Runrow-Signature"), r.body)
    if body is not None:
        assert r.body == body


def test_a_run_ending_is_delivered_once_signed_with_a_stable_delivery_id(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    workers("w1", *FAST)
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "delivered", 20, "the delivery")
    time.sleep(1.0)  # five webhook polls: nothing is sent twice
    assert receiver.count() == 1
    [got] = receiver.requests
    check_signed(got)
    row = delivery(db, run_id)
    body = json.loads(got.body)
    assert got.headers["Runrow-Delivery-Id"] == body["id"] == str(row["id"])
    assert got.headers["Runrow-Delivery-Attempt"] == "1"
    assert got.headers["Content-Type"] == "application/json"
    assert (body["type"], body["run_id"], body["status"]) == ("run.ended", str(run_id), "completed")
    assert got.body == encode_body(row["payload"])
    assert (row["attempts"], row["last_http_status"], row["worker_id"]) == (1, 200, "w1")


def test_a_new_delivery_wakes_an_idle_sender(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """The poll tick is 30 s: only the outbox's NOTIFY (runrow_webhooks) sends it this soon. Since
    migration 0037 nothing woke the sender, and a delivery waited for the tick (2 s by default)."""
    workers("w1", "--poll", "0.2", "--webhook-poll", "30")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "delivered", 10, "the delivery, woken")
    assert receiver.count() == 1


@pytest.mark.parametrize("receiver", [["close", "500", "hang"]], indirect=True)
def test_a_failing_hanging_500ing_receiver_is_retried_with_backoff_until_it_succeeds(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    workers("w1", *FAST, "--webhook-attempts", "5")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "delivered", 40, "the fourth attempt")
    assert receiver.count() == 4
    first = receiver.requests[0]
    for n, got in enumerate(receiver.requests, start=1):
        check_signed(got, first.body)  # the same body every time, signed every time
        assert got.headers["Runrow-Delivery-Id"] == first.headers["Runrow-Delivery-Id"]
        assert got.headers["Runrow-Delivery-Attempt"] == str(n)
    at = [r.at for r in receiver.requests]
    # Lower bounds only (a loaded box is slower, never faster): backoff 0.5 s doubling, after
    # the hang also the 1 s timeout.
    assert at[1] - at[0] >= 0.5 - 0.05
    assert at[2] - at[1] >= 1.0 - 0.05
    assert at[3] - at[2] >= 1.0 + 2.0 - 0.05
    row = delivery(db, run_id)
    assert (row["attempts"], row["last_http_status"], row["last_error"]) == (4, 200, "timed out after 1 s")


@pytest.mark.parametrize("receiver", [["500", "500"]], indirect=True)
def test_deliveries_are_counted_by_outcome_with_their_latency(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """Per-process counters beside the database's gauges (the audit: deliveries were visible only
    as webhooks_pending / webhooks_dead_lettered): one delivery refused twice (failed, then
    dead-lettered on its last attempt) and one delivered, each POST in the latency histogram."""
    w = workers("w1", *FAST, "--webhook-attempts", "2", "--metrics-port", "0")
    url = metrics_url(w)
    refused = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, refused) == "dead", 30, "the dead letter")
    other = Receiver([])
    try:
        delivered = enqueue_hooked(db, other.url)
        wait_until(lambda: state(db, delivered) == "delivered", 30, "the delivery")
    finally:
        other.close()
    counts = wait_until(
        lambda: (
            (s := scrape(url))
            and {o: value(s, "runrow_webhook_deliveries_total", outcome=o) for o in OUTCOMES}
            == {"delivered": 1, "failed": 1, "dead_lettered": 1}
            and s
        ),
        10,
        "one attempt of each outcome counted",
    )
    for outcome in OUTCOMES:
        assert value(counts, "runrow_webhook_delivery_seconds_count", outcome=outcome) == 1
        assert value(counts, "runrow_webhook_delivery_seconds_bucket", outcome=outcome, le="+Inf") == 1
    assert total(counts, "runrow_webhook_delivery_seconds_sum") > 0


OUTCOMES = ("delivered", "failed", "dead_lettered")


@pytest.mark.parametrize("receiver", [["slow"]], indirect=True)
def test_a_drain_lets_a_delivery_in_flight_end_and_records_it(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """SIGTERM while a receiver takes 2 s to answer 200: the drain cancelled the POST, so the
    attempt was lost, and on its last attempt the next claim dead-lettered the delivery unsent
    ("lease expired: worker w1 recorded no outcome of attempt 1"; the webhooks audit). The
    delivery in flight now ends, is recorded, and the worker exits 0."""
    w = workers("w1", *FAST, "--webhook-timeout", "5", "--webhook-attempts", "1")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: receiver.count() == 1, 20, "the receiver has the request")
    w.signal(signal.SIGTERM)
    assert w.wait_exit(30) == 0, w.log()
    row = delivery(db, run_id)
    assert (row["state"], row["attempts"], row["last_http_status"]) == ("delivered", 1, 200), row
    assert receiver.count() == 1


def test_a_delivery_goes_through_the_webhook_proxy(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """README's egress policy for untrusted users' URLs: the sender ignored every proxy
    (trust_env=False; 71 deliveries, 0 through HTTP_PROXY in the audit). --webhook-proxy sends
    each delivery through the proxy given; this stub proxy answers for the receiver and records
    the absolute URL a forward proxy is asked for."""
    asked: list[str] = []

    class Proxy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        w = workers("w1", *FAST, "--webhook-proxy", f"http://user:pw@127.0.0.1:{proxy.server_address[1]}")
        run_id = enqueue_hooked(db, receiver.url)
        wait_until(lambda: state(db, run_id) == "delivered", 20, "the delivery")
        assert asked == [receiver.url] and receiver.count() == 0
        assert f"through the proxy at 127.0.0.1:{proxy.server_address[1]}" in w.log()
        assert "pw@" not in w.log()
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.mark.parametrize("receiver", [["500"] * 10], indirect=True)
def test_a_receiver_that_keeps_failing_is_dead_lettered_after_n_attempts(
    db: psycopg.Connection, worker_db: str, receiver: Receiver, workers: Any
) -> None:
    workers("w1", *FAST, "--webhook-attempts", "3")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "dead", 30, "the dead letter")
    time.sleep(2.5)  # longer than the next backoff would be: no fourth attempt
    assert receiver.count() == 3
    row = delivery(db, run_id)
    assert (row["attempts"], row["last_http_status"], row["last_error"]) == (3, 500, "HTTP 500")
    health = db.execute(
        "SELECT pending, retrying, in_flight, dead_lettered FROM runrow.webhook_health"
    ).fetchone()
    assert health == (0, 0, 0, 1)
    outbox = db.execute("SELECT delivery_id, state FROM runrow.webhook_outbox").fetchall()
    assert outbox == [(row["id"], "dead")]
    status = subprocess.run(
        [sys.executable, "-m", "pyworker", "--database-url", worker_db, "status"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    lines = {line.split()[0]: line.split()[1:] for line in status.stdout.splitlines() if line.strip()}
    assert lines["webhooks_dead_lettered"] == ["1"]
    assert lines["webhooks_pending"] == ["0"]


@pytest.mark.parametrize("receiver", [["999", "999"]], indirect=True)
def test_a_status_outside_http_is_recorded_as_a_failed_attempt(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """httpx takes any three digits, and fail_webhook_delivery refused a 999 as http_status: no
    outcome was recorded, each attempt waited out its lease, and the dead letter said only
    "recorded no outcome" (the webhook audit)."""
    workers("w1", *FAST, "--webhook-attempts", "2")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "dead", 30, "the dead letter")
    row = delivery(db, run_id)
    assert (row["attempts"], row["last_http_status"], row["last_error"]) == (
        2,
        None,
        "HTTP 999: not an HTTP status code",
    )


@pytest.mark.parametrize("receiver", [["410"] * 5], indirect=True)
def test_410_gone_is_dead_lettered_on_its_first_attempt(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """410 Gone is the receiver saying the URL will not come back (the REST Hooks convention for
    "stop sending"): it was retried like a 500 until its attempts ran out."""
    workers("w1", *FAST, "--webhook-attempts", "5")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "dead", 15, "the dead letter")
    row = delivery(db, run_id)
    assert (row["attempts"], row["last_http_status"], row["last_error"]) == (
        1,
        410,
        "HTTP 410: the receiver says this URL is gone for good",
    )
    assert receiver.count() == 1


@pytest.fixture
def elsewhere() -> Iterator[Receiver]:
    """Where a redirect points: a receiver that must never be asked anything."""
    r = Receiver([])
    yield r
    r.close()


@pytest.mark.parametrize(
    "receiver", [[code] * 5 for code in ("301", "308", "302", "303", "307")], indirect=True, ids=str
)
def test_a_redirect_is_never_followed_and_a_permanent_one_ends_at_once(
    db: psycopg.Connection, receiver: Receiver, elsewhere: Receiver, workers: Any
) -> None:
    """301 Moved Permanently and 308 Permanent Redirect answer every attempt the same way: they
    were retried until the attempts ran out. The first now ends the delivery, dead-lettered with
    the status and the Location, saying what to fix. 302, 303 and 307 say the receiver is
    elsewhere for now: failed attempts retried like a 5xx, recorded with the Location. No
    Location is ever asked (the target is the receiver's to choose, and `serve` checked only
    the URL the user gave)."""
    receiver.location = elsewhere.url
    workers("w1", *FAST, "--webhook-attempts", "2")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "dead", 15, "the dead letter")
    status = int(receiver.script[0])
    if status in (301, 308):
        attempts = 1
        error = (
            f"HTTP {status}: the receiver says this URL moved for good (Location: {elsewhere.url}); "
            "redirects are not followed: fix the run's webhook_url"
        )
    else:
        attempts, error = 2, f"HTTP {status}: redirects are not followed (Location: {elsewhere.url})"
    row = delivery(db, run_id)
    assert (row["attempts"], row["last_http_status"], row["last_error"]) == (attempts, status, error)
    assert (receiver.count(), elsewhere.count()) == (attempts, 0)


def test_a_redirects_location_is_recorded_printable_and_cut() -> None:
    assert redirect_error(307, None) == "HTTP 307: redirects are not followed (Location: no Location)"
    shown = redirect_error(302, "http://x.test/\x1b[31m" + "a" * 600)
    assert "\x1b" not in shown and shown.endswith("a" * (500 - len("http://x.test/?[31m")) + ")")


def test_a_url_no_request_can_be_sent_to_is_dead_lettered_on_its_first_attempt(
    db: psycopg.Connection, workers: Any
) -> None:
    """enqueue_run takes http://xn--a.com/ (a host name's shape), but idna refuses to encode it, so
    httpx cannot build the request. That error escaped the sender: no outcome was recorded, and
    each of the attempts waited out its lease before being dead-lettered as "recorded no outcome".
    Every attempt would fail the same way, so the first one is the last."""
    workers("w1", *FAST, "--webhook-attempts", "5")
    run_id = enqueue_hooked(db, "http://xn--a.com/hook")
    wait_until(lambda: state(db, run_id) == "dead", 15, "the dead letter")
    row = delivery(db, run_id)
    assert row["attempts"] == 1 and row["last_http_status"] is None
    assert row["last_error"].startswith("webhook_url cannot be requested ("), row["last_error"]


def test_a_hanging_receiver_does_not_hold_up_the_other_deliveries(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """The sender claimed a batch and waited for all of it (asyncio.gather) before it claimed
    again, so one receiver hanging to the timeout held up every other delivery of the worker for
    that long (the webhook audit). Each delivery now has a slot of its own, claimed again as it
    frees. The timeout (60 s) is far past this test's waits: the hanging request is still in
    flight when the others have all been delivered."""
    workers("w1", *FAST, "--webhook-timeout", "60")
    stuck = enqueue_hooked(db, receiver.url + "/hang")
    wait_until(lambda: receiver.count() == 1, 20, "the request that hangs")
    others = [enqueue_hooked(db, receiver.url) for _ in range(3)]
    wait_until(lambda: all(state(db, r) == "delivered" for r in others), 20, "the others, while one hangs")
    row = delivery(db, stuck)
    assert (row["state"], row["attempts"], row["worker_id"]) == ("pending", 1, "w1")  # still in flight
    assert receiver.count() == 4


def test_a_hanging_receiver_gets_its_cap_and_another_receiver_goes_at_once(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """The audit: 40 deliveries to a receiver hanging past the timeout delayed another receiver's
    delivery from 0.56 s to 8.7 s, every sender slot taken by the hanging one's in turn. A claim
    now leases none to a receiver (scheme://host:port) that already has --webhook-per-receiver
    (default 4) leases anywhere in the fleet: two workers, twenty slots, four to the hanging
    receiver, and the other's delivery goes while those four still hang (timeout 60 s, far past
    this test's waits). Before, the two workers took ten each and the other waited a minute."""
    hanging = Receiver([])
    try:
        workers("w1", *FAST, "--webhook-timeout", "60")
        workers("w2", *FAST, "--webhook-timeout", "60")
        stuck = [enqueue_hooked(db, hanging.url + "/hang") for _ in range(40)]
        wait_until(lambda: all(state(db, r) is not None for r in stuck), 30, "the forty runs' endings")
        wait_until(lambda: hanging.count() >= 4, 20, "the hanging receiver's first requests")
        good = enqueue_hooked(db, receiver.url)
        wait_until(lambda: state(db, good) == "delivered", 20, "the other receiver's, while one hangs")
        in_flight = db.execute(
            "SELECT count(*) FILTER (WHERE claim_token IS NOT NULL), count(*) FILTER (WHERE attempts = 0) "
            "FROM runrow.webhook_delivery WHERE run_id = ANY(%s)",
            (stuck,),
        ).fetchone()
        assert in_flight == (4, 36)
        assert hanging.count() == 4
    finally:
        hanging.close()


def test_a_receiver_at_its_cap_gets_its_next_delivery_as_one_ends(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """A delivery held back at its receiver's cap waited for the next poll tick (here 30 s) though
    the worker's own delivery to that receiver had ended: a delivery's end now wakes the claim.
    Eight deliveries due before the worker starts, one at a time to the one receiver."""
    runs = [enqueue_hooked(db, receiver.url) for _ in range(8)]
    db.execute(
        "SELECT runrow.finish_run(c.run_id, c.claim_token, 'completed') "
        "FROM runrow.claim_runs('sql', 8, 60) AS c"
    )
    workers("w1", "--poll", "0.2", "--webhook-poll", "30", "--webhook-per-receiver", "1")
    wait_until(lambda: all(state(db, r) == "delivered" for r in runs), 15, "eight deliveries, one at a time")
    assert receiver.count() == 8


def test_a_payload_python_cannot_read_is_sent_as_stored_and_holds_up_no_other(
    db: psycopg.Connection, worker_db_superuser: str, receiver: Receiver, workers: Any
) -> None:
    """A payload written before migration 0069 (which now refuses such a result) that Python
    cannot decode: nested 3,000 deep, or a number of 5,001 digits. The claim's fetch raised after
    the leases were granted, so that delivery and every one claimed beside it lapsed together on
    every attempt, and all were dead-lettered with nothing sent (the webhook audit). Each payload
    is now read on its own: what Python cannot re-encode faithfully is sent as the database's
    own JSON text, signed like any other, and the others go out as always."""
    runs = [enqueue_hooked(db, receiver.url) for _ in range(4)]
    # Ended here by SQL, with no worker running, so each delivery waits until its payload is set.
    db.execute(
        "SELECT runrow.finish_run(c.run_id, c.claim_token, 'completed', '{\"text\": \"x\"}') "
        "FROM runrow.claim_runs('sql', 4, 60) AS c"
    )
    odd = {
        runs[1]: "[" * 3000 + "]" * 3000,
        runs[2]: '{"n": 1' + "0" * 5000 + "}",
        runs[3]: '{"n": 1' + "0" * 400 + ".5}",  # a float would be inf, and json.dumps say Infinity
    }
    with psycopg.connect(worker_db_superuser, autocommit=True) as su:
        su.execute("SET session_replication_role = replica")  # past the guard that keeps payloads fixed
        for run_id, result in odd.items():
            su.execute(
                "UPDATE runrow.webhook_delivery SET payload = jsonb_set(payload, '{result}', %s::jsonb) "
                "WHERE run_id = %s",
                (result, run_id),
            )
    stored = {
        run_id: (str(delivery_id), text)
        for run_id, delivery_id, text in db.execute(
            "SELECT run_id, id, payload::text FROM runrow.webhook_delivery WHERE run_id = ANY(%s)", (runs,)
        )
    }
    workers("w1", *FAST)
    wait_until(lambda: all(state(db, r) == "delivered" for r in runs), 20, "all four deliveries")
    assert receiver.count() == 4
    sent = {r.headers["Runrow-Delivery-Id"]: r for r in receiver.requests}
    for run_id, (delivery_id, text) in stored.items():
        got = sent[delivery_id]
        check_signed(got)
        if run_id in (runs[1], runs[2]):
            assert got.body == text.encode()
        else:
            assert got.body == encode_body(exact_json.loads(text))  # the usual form
    assert b'"n":1' + b"0" * 400 + b".5}" in sent[stored[runs[3]][0]].body  # never Infinity


def test_body_of_is_the_compact_sorted_form_unless_python_cannot_carry_the_payload() -> None:
    assert body_of('{"b": 1, "a": [2, "é"]}') == '{"a":[2,"é"],"b":1}'.encode()
    deep = "[" * 3000 + "]" * 3000
    assert body_of(deep) == deep.encode()
    digits = '{"n": 1' + "0" * 5000 + "}"
    assert body_of(digits) == digits.encode()
    beyond = '{"n": 1' + "0" * 400 + ".5}"  # a float would be inf, and json.dumps say Infinity
    assert body_of(beyond) == ('{"n":1' + "0" * 400 + ".5}").encode()
    exact = '{"b": [1.50, 1e5, -0.0, 0.0000001], "a": 12345678901234567.89}'
    assert body_of(exact) == b'{"a":12345678901234567.89,"b":[1.50,1e5,-0.0,0.0000001]}'


def test_a_results_numbers_are_delivered_as_the_run_stored_them(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """A result written by another language's worker (finish_run over SQL) with numbers a double
    cannot hold: read as floats, they went out as 1.2345678901234568e+16 and 1.0 (the webhooks
    audit). They are sent digit for digit, and the signature covers the bytes sent."""
    run_id = enqueue_hooked(db, receiver.url)
    db.execute(
        "SELECT runrow.finish_run(c.run_id, c.claim_token, 'completed', "
        '\'{"amount": 12345678901234567.89, "id": 1.00000000000000000001}\') '
        "FROM runrow.claim_runs('sql', 1, 60) AS c"
    )
    workers("w1", *FAST)
    wait_until(lambda: state(db, run_id) == "delivered", 20, "the delivery")
    [got] = receiver.requests
    check_signed(got)
    assert b'"result":{"amount":12345678901234567.89,"id":1.00000000000000000001}' in got.body
    [[text]] = db.execute("SELECT payload::text FROM runrow.webhook_delivery WHERE run_id = %s", (run_id,))
    assert got.body == encode_body(exact_json.loads(text))


@pytest.mark.parametrize("receiver", [["hold"]], indirect=True)
def test_a_worker_killed_mid_delivery_does_not_lose_it(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    # --webhook-timeout 3: the lease is 3 + 5 s; w1 is killed long before it would time out.
    doomed = workers("w1", "--poll", "0.2", "--webhook-poll", "0.2", "--webhook-timeout", "3")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: receiver.count() == 1, 20, "w1's request to reach the receiver")
    doomed.kill()  # SIGKILL while the receiver holds the request: no outcome recorded
    row = delivery(db, run_id)
    assert (row["state"], row["attempts"], row["worker_id"]) == ("pending", 1, "w1")
    workers("w2", "--poll", "0.2", "--webhook-poll", "0.2", "--webhook-timeout", "3")
    wait_until(lambda: state(db, run_id) == "delivered", 40, "w2 to take the lapsed lease over")
    first, second = receiver.requests
    assert second.headers["Runrow-Delivery-Id"] == first.headers["Runrow-Delivery-Id"] == str(row["id"])
    assert (first.headers["Runrow-Delivery-Attempt"], second.headers["Runrow-Delivery-Attempt"]) == ("1", "2")
    check_signed(second, first.body)
    row = delivery(db, run_id)
    assert (row["attempts"], row["worker_id"]) == (2, "w2")
    assert row["last_error"] == "lease expired: worker w1 recorded no outcome of attempt 1"
    status = db.execute("SELECT status FROM runrow.agent_run WHERE id = %s", (run_id,)).fetchone()
    assert status == ("completed",)


def test_verify_signature_accepts_the_senders_header_and_nothing_else() -> None:
    body = b'{"id":"x","type":"run.ended"}'
    now = 1_800_000_000
    header = signature_header(SECRET, now, body)
    assert header.startswith(f"t={now},v1=") and len(header.split("v1=")[1]) == 64
    assert verify_signature(SECRET, header, body, now=now + 10) == now
    # A rotation: a second v1 with another key next to the right one still verifies.
    rotated = f"{header},v1={signature_header('old-secret', now, body).split('v1=')[1]}"
    assert verify_signature(SECRET, rotated, body, now=now) == now
    bad = {
        "tampered body": (SECRET, header, body + b" "),
        "wrong secret": ("another-secret", header, body),
        "replayed late": (SECRET, header, body),
        "no header": (SECRET, None, body),
        "no v1": (SECRET, f"t={now}", body),
        "no t": (SECRET, header.split(",", 1)[1], body),
        "timestamp edited": (SECRET, header.replace(f"t={now}", f"t={now + 1}"), body),
        # A non-ASCII v1 made hmac.compare_digest raise TypeError: a receiver answered 500.
        "non-ASCII v1": (SECRET, f"t={now},v1=é", body),
    }
    for what, (secret, hdr, payload) in bad.items():
        when = now + 301 if what == "replayed late" else now
        with pytest.raises(SignatureError):
            verify_signature(secret, hdr, payload, now=when)
            pytest.fail(what)


def test_the_http_api_takes_webhook_url_and_names_it_when_bad(worker_db: str, db: psycopg.Connection) -> None:
    for server in serve(worker_db):
        with httpx.Client(base_url=server.url, timeout=20) as client:
            conv = uuid.uuid4()
            # A public address, as a user's webhook must be (a .test name does not resolve: 422).
            ok = client.post(
                f"/conversations/{conv}/runs",
                json={"content": "hi", "webhook_url": "https://93.184.216.34/runrow"},
                headers=ALICE,
            )
            assert ok.status_code == 202, ok.text
            stored = db.execute(
                "SELECT webhook_url FROM runrow.agent_run WHERE id = %s", (uuid.UUID(ok.json()["run_id"]),)
            ).fetchone()
            assert stored == ("https://93.184.216.34/runrow",)
            before = db.execute("SELECT count(*) FROM runrow.agent_run").fetchone()
            for bad in ("ftp://hooks.example.test/", "https://exa mple.test/", 42, "h" * 3000):
                r = client.post(
                    f"/conversations/{uuid.uuid4()}/runs",
                    json={"content": "hi", "webhook_url": bad},
                    headers=ALICE,
                )
                assert r.status_code == 400, r.text
                assert "webhook_url" in error_of(r)["message"]
            assert db.execute("SELECT count(*) FROM runrow.agent_run").fetchone() == before


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--webhook-attempts", "0"),
        ("--webhook-timeout", "nan"),
        ("--webhook-backoff", "0"),
        ("--webhook-poll", "-1"),
        ("--webhook-per-receiver", "0"),
        ("--webhook-per-receiver", "2.5"),
        # '' turned delivery off without a word.
        ("--webhook-secret", ""),
        ("--webhook-proxy", "socks5://127.0.0.1:1080"),
        ("--webhook-proxy", "proxy:3128"),
        ("--webhook-proxy", "http://127.0.0.1:99999"),
        ("--webhook-signing", "users"),
        ("--webhook-signing", "User"),
        ("--webhook-previous-secret", ""),
    ],
)
def test_webhook_flags_out_of_range_are_usage_errors_naming_the_flag(flag: str, value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pyworker", "worker", flag, value],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert flag in result.stderr and "Traceback" not in result.stderr
