"""The chat page in a real headless Chromium (Debian's `chromium`, driven by playwright; no
browser download): send a message and watch it stream, reload mid-stream and see the text
continue with no gap and no duplicate, press Stop, approve a pending tool call.

Runs are answered by a real `runrow worker` with the echo handler; the test adds the echo
text to the page's POST (page.route), which is all the echo handler needs. A screenshot of
the page mid-stream is saved to $RUNROW_SCREENSHOT_DIR (default /tmp).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import psycopg
import pytest
from http_support import ALICE, TOKENS, Server, private_database, serve
from playwright.sync_api import Browser, Page, Route, sync_playwright
from steps_support import begin, tool_defs, tool_turn
from tail_support import claim
from worker_support import WorkerProcess, events, status, streamed_text, wait_until

CHROMIUM = os.environ.get("RUNROW_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ALICE_TOKEN = ALICE["Authorization"].removeprefix("Bearer ")
STORY = " ".join(f"w{i:03d}" for i in range(240))  # every piece unique: a repeat or a gap shows


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: `make test` installs it (RUNROW_WITH_BROWSER=1 scripts/bootstrap.sh)"
        )
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_page")


@pytest.fixture(scope="module")
def live(page_db: str) -> Iterator[Server]:
    worker = WorkerProcess(page_db, "page-echo", ["--concurrency", "2", "--lease", "5", "--poll", "1"])
    try:
        worker.wait_log("worker page-echo started")
        yield from serve(page_db, tokens=TOKENS)
    finally:
        worker.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page whose every test also checks that the service's Content-Security-Policy
    (pyworker/http/headers.py) refused nothing the chat page does."""
    context = browser.new_context(viewport={"width": 1000, "height": 700})
    p = context.new_page()
    p.set_default_timeout(20_000)
    refused: list[str] = []
    p.on("console", lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None)
    yield p
    context.close()
    assert not refused, f"the page broke its own Content-Security-Policy: {refused}"


def echo_back(text: str, duration: float) -> Callable[[Route], None]:
    """A route handler that adds the echo worker's instructions to the page's enqueue POST."""

    def handle(route: Route) -> None:
        body = json.loads(route.request.post_data or "{}")
        body["metadata"] = {"echo": text, "duration": duration}
        route.continue_(post_data=json.dumps(body))

    return handle


def sign_in(page: Page, server: Server) -> None:
    page.goto(server.url + "/")
    page.fill("#token", ALICE_TOKEN)
    page.click("#token-form button[type=submit]")


def sign_in_and_send(page: Page, server: Server, message: str) -> None:
    sign_in(page, server)
    page.fill("#message", message)
    page.click("#send")


def park_on_approval(
    db: psycopg.Connection, tool: str, args: dict, conversation: uuid.UUID | None = None
) -> tuple[uuid.UUID, str]:
    """Alice's run, claimed by the test (no worker) and parked on an irreversible call of `tool`
    that waits for her approval: the run and the call's key."""
    run_id = db.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"do it\"', "
        "model => 'echo', user_id => 'alice', tools => %s::jsonb)",
        (conversation or uuid.uuid4(), tool_defs(tool)),
    ).fetchone()[0]
    token = claim(db, run_id)
    key = tool_turn(db, run_id, token, "toolu_1", tool, args)
    assert begin(db, run_id, token, key, tool, args, "irreversible")[0] == "needs_approval"
    return run_id, key


def page_text(page: Page) -> str:
    """The answer as rendered (textContent: exactly the characters, whatever the CSS)."""
    return str(page.eval_on_selector(".turn:last-child .assistant .bubble", "el => el.textContent"))


def run_of(page: Page) -> uuid.UUID:
    page.wait_for_selector(".turn:last-child .assistant[data-run-id]:not([data-run-id=''])")
    return uuid.UUID(page.get_attribute(".turn:last-child .assistant", "data-run-id"))


def wait_text(page: Page, at_least: int) -> None:
    page.wait_for_function(
        "n => document.querySelector('.turn:last-child .assistant .bubble').textContent.length >= n",
        arg=at_least,
    )


def test_reload_mid_stream_continues_with_no_gap_and_no_duplicate(
    live: Server, page_db: str, page: Page
) -> None:
    page.route("**/conversations/*/runs", echo_back(STORY, 5.0))
    sign_in_and_send(page, live, "Tell me a long story")
    run_id = run_of(page)
    with psycopg.connect(page_db, autocommit=True) as db:
        for reload_at in (len(STORY) // 5, len(STORY) // 2):
            wait_text(page, reload_at)
            if reload_at == len(STORY) // 5:
                shot = Path(os.environ.get("RUNROW_SCREENSHOT_DIR", "/tmp")) / "runrow-chat-midstream.png"
                page.screenshot(path=str(shot))
            before = page_text(page)
            assert status(db, run_id) == "running" and len(before) < len(STORY), "the reload is mid-stream"
            page.reload()
            page.wait_for_selector(".turn:last-child .assistant .bubble", state="attached")
            # The transcript is back at once from sessionStorage, before the stream resumes.
            assert page_text(page).startswith(before)
        page.wait_for_selector(".turn:last-child .assistant.completed")
        assert page_text(page) == streamed_text(db, run_id) == STORY
        assert status(db, run_id) == "completed"
        # The page names a new conversation with a time-ordered id (UUIDv7): its finished turns'
        # index entries land beside other recent ones (pyworker/db/ids.py).
        (conversation,) = db.execute(
            "SELECT conversation_id FROM runrow.agent_run WHERE id = %s", (run_id,)
        ).fetchone()
        assert conversation.version == 7, conversation
    assert page.inner_text(".turn:last-child .user .bubble") == "Tell me a long story"
    assert page.is_enabled("#send") and not page.is_enabled("#stop")


def test_stop_ends_the_run_cancelled_and_keeps_the_partial_text(
    live: Server, page_db: str, page: Page
) -> None:
    page.route("**/conversations/*/runs", echo_back(STORY, 8.0))
    sign_in_and_send(page, live, "Go on and on")
    run_id = run_of(page)
    wait_text(page, 40)
    page.click("#stop")
    page.wait_for_selector(".turn:last-child .assistant.cancelled")
    with psycopg.connect(page_db, autocommit=True) as db:
        assert status(db, run_id) == "cancelled"
        partial = streamed_text(db, run_id)
        result = db.execute("SELECT result FROM runrow.agent_run WHERE id = %s", (run_id,)).fetchone()[0]
    assert 40 <= len(partial) < len(STORY) and STORY.startswith(partial)
    assert page_text(page) == partial and result == {"text": partial}
    assert page.inner_text(".turn:last-child .assistant .meta") == "stopped"


def test_an_enqueue_answered_503_is_sent_again_with_its_key_until_it_lands(
    live: Server, page_db: str, page: Page
) -> None:
    """While the service's database is away (a restart, a failover) a POST is answered 503 with
    Retry-After. The page marked the turn failed at the first one, though the POST is safe to
    repeat (the failover audit: 11 such answers across four failovers, each turn given up, and a
    run created before a lost answer ran and was paid for unseen). It sends it again with the
    same Idempotency-Key, after Retry-After, and follows the run it gets."""
    sent: list[str] = []
    forward = echo_back("back again", 0.2)

    def unavailable_twice(route: Route) -> None:
        sent.append(route.request.headers.get("idempotency-key", ""))
        if len(sent) <= 2:
            error = {"error": {"type": "unavailable", "message": "the database is unavailable; try again"}}
            route.fulfill(status=503, headers={"Retry-After": "1"}, json=error)
        else:
            forward(route)

    page.route("**/conversations/*/runs", unavailable_twice)
    sign_in_and_send(page, live, "Through a failover")
    run_id = run_of(page)
    page.wait_for_selector(".turn:last-child .assistant.completed")
    assert len(sent) == 3 and len(set(sent)) == 1 and sent[0], sent  # one key, three POSTs
    assert page_text(page) == "back again"
    with psycopg.connect(page_db, autocommit=True) as db:
        assert status(db, run_id) == "completed"


@pytest.fixture(scope="module")
def quiet_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_page_quiet")


@pytest.fixture(scope="module")
def quiet(quiet_db: str) -> Iterator[Server]:
    """No worker here: the test claims the run itself and parks it on an approval."""
    yield from serve(quiet_db, tokens=TOKENS)


def test_approve_a_pending_tool_call(quiet: Server, quiet_db: str, page: Page) -> None:
    with psycopg.connect(quiet_db, autocommit=True) as db:
        run_id, key = park_on_approval(db, "send_wire", {"amount": 250})
        sign_in(page, quiet)
        item = page.wait_for_selector(f"#approval-list li[data-key='{key}']")
        assert "send_wire" in item.inner_text() and '"amount":250' in item.inner_text()
        item.query_selector("button.approve").click()
        page.wait_for_selector("#approvals", state="hidden")
        decided = db.execute(
            "SELECT state, decided_by FROM runrow.tool_effect WHERE idempotency_key = %s", (key,)
        ).fetchone()
        assert decided == ("approved", "alice")
        wait_until(lambda: status(db, run_id) == "queued", 10, "the approved run to be requeued")


@contextlib.contextmanager
def other_site(html: str) -> Iterator[str]:
    """A page of another origin: served from another loopback port, at localhost (the service is
    at 127.0.0.1). A real server: Chromium will not let a page it takes for public (a routed,
    made-up origin) frame or fetch a loopback address at all."""
    body = html.encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    site = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=site.serve_forever, name="other-site", daemon=True).start()
    try:
        yield f"http://localhost:{site.server_address[1]}/"
    finally:
        site.shutdown()
        site.server_close()


def test_the_page_cannot_be_framed_by_another_site(quiet: Server, browser: Browser) -> None:
    """The audit's clickjacking: a page on another site framed the chat page at opacity 0.3
    and a click meant for it approved a pending tool call. frame-ancestors 'none' (and
    X-Frame-Options: DENY) make the browser refuse to show the service in any frame."""
    context = browser.new_context()
    try:
        with other_site(f'<iframe id="victim" src="{quiet.url}/" style="opacity:0.3"></iframe>') as url:
            attacker = context.new_page()
            attacker.goto(url, wait_until="load")  # the frame's load included
            victim = attacker.frame_locator("#victim")
            assert victim.locator("#approval-list").count() == 0, "the chat page rendered inside a frame"
    finally:
        context.close()


@pytest.fixture(scope="module")
def dev_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_page_dev")


@pytest.fixture(scope="module")
def dev(dev_db: str) -> Iterator[Server]:
    """runrow serve --insecure-dev: no token, every caller is user dev. No worker."""
    yield from serve(dev_db, tokens={}, insecure_dev=True)


def test_insecure_dev_the_page_works_and_another_site_cannot_post(
    dev: Server, dev_db: str, page: Page, browser: Browser
) -> None:
    """The audit's forgery: a page on another origin POSTed a prompt with fetch, mode no-cors,
    a byte body (so no Content-Type) and got a run as user dev. Now it gets nothing (415 for the
    missing type, 403 for its Origin), while the page's own same-origin requests go through."""
    page.goto(dev.url + "/")
    page.fill("#message", "hello from the page")
    page.click("#send")
    run_id = run_of(page)
    page.click("#stop")  # a POST without a body
    page.wait_for_selector(".turn:last-child .assistant.cancelled")
    with psycopg.connect(dev_db, autocommit=True) as db:
        assert status(db, run_id) == "cancelled"
        conversation = uuid.uuid4()
        forge = f"""<script>
          fetch("{dev.url}/conversations/{conversation}/runs", {{
            method: "POST", mode: "no-cors",
            body: new TextEncoder().encode('{{"content": "an attacker prompt"}}'),
          }}).finally(() => {{ document.title = "sent"; }});
        </script>"""
        context = browser.new_context()
        try:
            with other_site(forge) as url:
                attacker = context.new_page()
                attacker.goto(url)
                attacker.wait_for_function("document.title === 'sent'")
        finally:
            context.close()
        forged = db.execute(
            "SELECT count(*) FROM runrow.agent_run WHERE conversation_id = %s", (conversation,)
        ).fetchone()
        assert forged == (0,), "another site's page enqueued a run"


@pytest.fixture(scope="module")
def cards_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_page_cards")


@pytest.fixture(scope="module")
def cards(cards_db: str) -> Iterator[Server]:
    """No worker, and no other test's runs: the test claims its run itself."""
    yield from serve(cards_db, tokens=TOKENS)


def test_an_approval_card_shows_bidi_and_invisible_characters_as_escapes(
    cards: Server, cards_db: str, page: Page
) -> None:
    """JSON.stringify leaves U+202E (right-to-left override) as it is: the card read
    `echo safe -rf ; rm` for a call whose command is `echo safe \u202e; fr- mr\u202c`. The person
    approving must see what runs, and which run and conversation it belongs to."""
    hostile = {"cmd": "echo safe \u202e; fr- mr\u202c", "note": "zero\u200bwidth\u2066x\u2069\ufeff\u00ad"}
    conversation = uuid.uuid4()
    with psycopg.connect(cards_db, autocommit=True) as db:
        run_id, key = park_on_approval(db, "shell", hostile, conversation)
        sign_in(page, cards)
        item = page.wait_for_selector(f"#approval-list li[data-key='{key}']")
        shown = str(item.eval_on_selector("code", "el => el.textContent"))
        assert shown == (
            'shell({"cmd":"echo safe \\u202e; fr- mr\\u202c",'
            '"note":"zero\\u200bwidth\\u2066x\\u2069\\ufeff\\u00ad"})'
        ), shown
        assert str(item.eval_on_selector("code", "el => getComputedStyle(el).unicodeBidi")) == "isolate"
        origin = item.inner_text()
        assert f"run {run_id}" in origin and f"conversation {conversation}" in origin, origin
        assert "irreversible" in origin, origin


@pytest.fixture(scope="module")
def many_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_page_many")


@pytest.fixture(scope="module")
def many(many_db: str) -> Iterator[Server]:
    """No worker: the test parks its runs on approvals itself."""
    yield from serve(many_db, tokens=TOKENS)


def test_the_page_shows_every_pending_approval_past_the_first_page(
    many: Server, many_db: str, page: Page
) -> None:
    """GET /approvals answers 100 a page with `next`; the page read the first page only, so the
    101st call waiting on alice never had a card to approve. 201 approvals: three pages."""
    with psycopg.connect(many_db, autocommit=True) as db:
        keys = [park_on_approval(db, "send_wire", {"amount": i})[1] for i in range(201)]
        sign_in(page, many)
        page.wait_for_selector(f"#approval-list li[data-key='{keys[0]}']")
        page.wait_for_function(
            "n => document.querySelectorAll('#approval-list li').length >= n", arg=len(keys)
        )
        shown = page.eval_on_selector_all("#approval-list li", "items => items.map((li) => li.dataset.key)")
        assert shown == keys, (len(shown), len(keys))  # each once, oldest waiting first
        # The last one can be decided from the page like the first.
        page.query_selector(f"#approval-list li[data-key='{keys[-1]}'] button.reject").click()
        page.wait_for_function("n => document.querySelectorAll('#approval-list li').length === n", arg=200)
        decided = db.execute(
            "SELECT state, decided_by FROM runrow.tool_effect WHERE idempotency_key = %s", (keys[-1],)
        ).fetchone()
        assert decided == ("rejected", "alice")


@pytest.fixture(scope="module")
def slow_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_page_slow")


@pytest.fixture(scope="module")
def slow(slow_db: str) -> Iterator[Server]:
    """No worker: the test parks its runs on approvals itself."""
    yield from serve(slow_db, tokens=TOKENS)


@contextlib.contextmanager
def unrouted(page: Page) -> Iterator[None]:
    """Routes removed on the way out, so that closing the page does not fail a handler mid-way."""
    try:
        yield
    finally:
        page.unroute_all(behavior="ignoreErrors")


PAGE_DELAY = 1.5  # seconds each GET /approvals takes: three pages outlast the page's 3 s poll


def test_approvals_show_when_walking_their_pages_outlasts_the_poll_interval(
    slow: Server, slow_db: str, page: Page
) -> None:
    """Every 3 s the page started a poll walking all of GET /approvals' pages, and a poll a later
    one overtook drew nothing: once the walk took longer than 3 s no poll ever drew (and the
    overtaken ones kept fetching). Here the service answers 2 a page (the route rewrites the
    page's limit), each page 1.5 s late: 5 approvals, three pages, 4.5 s a walk."""
    asked: list[dict[str, list[str]]] = []

    def slow_small_pages(route: Route) -> None:
        if route.request.method != "GET":
            route.continue_()
            return
        url = urlsplit(route.request.url)
        query = parse_qs(url.query)
        asked.append(query)
        small = urlunsplit(url._replace(query=urlencode({**query, "limit": ["2"]}, doseq=True)))
        response = route.fetch(url=small)
        time.sleep(PAGE_DELAY)  # a slow service, not an assertion
        route.fulfill(response=response)

    page.route("**/approvals?*", slow_small_pages)
    page.route("**/approvals", slow_small_pages)
    with psycopg.connect(slow_db, autocommit=True) as db, unrouted(page):
        keys = [park_on_approval(db, "send_wire", {"amount": i})[1] for i in range(5)]
        sign_in(page, slow)
        page.wait_for_function(
            "n => document.querySelectorAll('#approval-list li').length === n", arg=len(keys), timeout=15_000
        )
        shown = page.eval_on_selector_all("#approval-list li", "items => items.map((li) => li.dataset.key)")
        assert shown == keys
        # One walk at a time: each first page is asked for after the walk before ended.
        walks = ["after" not in q for q in asked]
        assert walks[: len(walks) - len(walks) % 3] == [True, False, False] * (len(walks) // 3), walks
        assert all(q.get("limit") == ["1000"] for q in asked), asked  # the fewest pages the service allows
        # A decision still redraws at once, overtaking a tick's walk in flight.
        page.query_selector(f"#approval-list li[data-key='{keys[0]}'] button.reject").click()
        page.wait_for_function(
            "n => document.querySelectorAll('#approval-list li').length === n", arg=len(keys) - 1
        )
        assert page.query_selector(f"#approval-list li[data-key='{keys[0]}']") is None


@pytest.fixture(scope="module")
def resume_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_page_resume")


@pytest.fixture(scope="module")
def resumable(resume_db: str) -> Iterator[Server]:
    """No worker of its own: the test starts one, kills it mid-text and starts another."""
    yield from serve(resume_db, tokens=TOKENS)


TAKEOVER_FLAGS = [
    "--concurrency",
    "1",
    "--lease",
    "2",
    "--grace",
    "1",
    "--reap-interval",
    "0.3",
    "--poll",
    "0.3",
]


def test_text_an_earlier_attempt_streamed_is_removed_live_after_a_resume(
    resumable: Server, resume_db: str, page: Page
) -> None:
    def with_attempts(route: Route) -> None:
        body = json.loads(route.request.post_data or "{}")
        body.update(metadata={"echo": STORY, "duration": 5.0}, max_attempts=3)
        route.continue_(post_data=json.dumps(body))

    page.route("**/conversations/*/runs", with_attempts)
    first = WorkerProcess(resume_db, "page-cut-off", TAKEOVER_FLAGS)
    second: WorkerProcess | None = None
    try:
        first.wait_started()
        sign_in_and_send(page, resumable, "Tell me a story, twice if you must")
        run_id = run_of(page)
        wait_text(page, len(STORY) // 5)
        first.kill()  # SIGKILL mid-text: the echo handler starts over on the next attempt
        with psycopg.connect(resume_db, autocommit=True) as db:
            partial = streamed_text(db, run_id)
            second = WorkerProcess(resume_db, "page-resumer", TAKEOVER_FLAGS)
            wait_until(lambda: superseded_then_text(db, run_id), 30, "the resumed attempt to stream")
            while status(db, run_id) == "running":
                shown = page_text(page)
                assert STORY.startswith(shown), "the cut-off partial is gone while the answer streams"
                page.wait_for_timeout(200)
            page.wait_for_selector(".turn:last-child .assistant.completed")
            assert status(db, run_id) == "completed"
            assert streamed_text(db, run_id) == partial + STORY, "the journal holds both attempts' text"
        assert page_text(page) == STORY
        page.reload()  # what sessionStorage kept is the answer too
        page.wait_for_selector(".turn:last-child .assistant.completed")
        assert page_text(page) == STORY
    finally:
        first.close()
        if second is not None:
            second.close()


def superseded_then_text(db: psycopg.Connection, run_id: uuid.UUID) -> bool:
    types = [e["type"] for e in events(db, run_id)]
    return "superseded" in types and "text_delta" in types[types.index("superseded") :]
