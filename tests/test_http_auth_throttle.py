"""Failed authentications are throttled by client address (`runrow serve
--auth-failures-per-minute`): every bad bearer token was a 401 at full speed, so tokens could be
guessed as fast as the service answered. Past N failures a minute an address gets 429
too_many_auth_failures with Retry-After; a user who authenticated from that address before
still passes (clients sharing a NAT), any other token, right or wrong, is a 429 (so a hit is not
told apart from a miss); other addresses are not affected; memory stays bounded."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from http_support import ALICE, BOB, private_database
from metrics_support import scrape, value
from serve_process import serve_process

from pyworker.http.auth_throttle import AuthFailureLimiter, address_key

WRONG = {"Authorization": "Bearer not-a-token-of-anyone-000"}


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_auth_throttle")


def test_an_address_past_its_failures_gets_429_and_known_users_and_other_addresses_do_not(
    db: str, tmp_path: Path
) -> None:
    # 2 a minute: the bucket refills one failure per 30 s, longer than this test's requests take.
    with serve_process(db, tmp_path, ["--auth-failures-per-minute", "2"]) as serve:
        run = f"/runs/{uuid.uuid4()}"
        here = httpx.Client(base_url=serve.url, timeout=20)
        # Another client address: all of 127/8 is loopback on Linux.
        there = httpx.Client(
            base_url=serve.url, timeout=20, transport=httpx.HTTPTransport(local_address="127.0.0.2")
        )
        with here, there:
            assert here.get(run, headers=ALICE).status_code == 404  # alice is known at this address
            assert [here.get(run, headers=WRONG).status_code for _ in range(2)] == [401, 401]
            refused = [here.get(run, headers=headers) for headers in (WRONG, {}, BOB)]
            still_alice = here.get(run, headers=ALICE)
            elsewhere = [there.get(run, headers=headers).status_code for headers in (BOB, WRONG)]
            scraped = scrape(f"{serve.url}/metrics")
    for response in refused:  # bob's right token too: else a hit answers 404 and a miss 429
        assert response.status_code == 429, response.text
        assert response.json()["error"]["type"] == "too_many_auth_failures"
        assert "--auth-failures-per-minute" in response.json()["error"]["message"]
        assert 1 <= int(response.headers["Retry-After"]) <= 30
    assert still_alice.status_code == 404, still_alice.text  # authenticated, the run is unknown
    assert elsewhere == [404, 401]
    assert value(scraped, "runrow_http_auth_failures_total", status="401") == 3
    assert value(scraped, "runrow_http_auth_failures_total", status="429") == 3


def test_off_with_zero(db: str, tmp_path: Path) -> None:
    with serve_process(db, tmp_path, ["--auth-failures-per-minute", "0"]) as serve:
        with httpx.Client(base_url=serve.url, timeout=20) as client:
            statuses = {client.get("/approvals", headers=WRONG).status_code for _ in range(30)}
    assert statuses == {401}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_refills_at_n_a_minute() -> None:
    clock = Clock()
    limiter = AuthFailureLimiter(6, clock=clock)  # one failure back every 10 s
    for _ in range(6):
        assert limiter.retry_after("a") is None
        limiter.failed("a")
    assert limiter.retry_after("a") == 10
    clock.now += 9.5
    assert limiter.retry_after("a") == 1
    clock.now += 0.5
    assert limiter.retry_after("a") is None
    limiter.failed("a")
    assert limiter.retry_after("a") == 10
    assert limiter.retry_after("b") is None and len(limiter) == 1  # a look adds nothing


def test_only_users_known_at_the_address_pass_it_while_throttled() -> None:
    limiter = AuthFailureLimiter(1, clock=Clock())
    limiter.succeeded("a", "alice")
    limiter.failed("a")
    assert limiter.retry_after("a") is not None
    assert limiter.may_pass("a", "alice")
    assert not limiter.may_pass("a", "bob")
    assert not limiter.may_pass("b", "alice")


def test_memory_is_bounded_however_many_addresses_fail() -> None:
    limiter = AuthFailureLimiter(10, max_addresses=1000, clock=Clock())
    for n in range(50_000):
        limiter.failed(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
        limiter.succeeded(f"u{n}", "alice")
    assert len(limiter) == 1000
    for n in range(100):  # one address with many users keeps a bounded few
        limiter.succeeded("shared", f"user{n}")
    assert limiter.may_pass("shared", "user99") and not limiter.may_pass("shared", "user0")


def test_an_ipv6_host_counts_by_its_64() -> None:
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff:2") == "2001:db8::/64"
    assert address_key("2001:db8:0:1::1") != address_key("2001:db8::1")
    assert address_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert address_key("10.0.0.7") == "10.0.0.7"
    assert address_key(None) == "(unknown)"


def test_behind_a_trusted_proxy_the_forwarded_client_is_throttled_not_the_proxy(
    db: str, tmp_path: Path
) -> None:
    """Behind a reverse proxy every client's TCP peer is the proxy: one client's bad tokens
    throttled all. With --forwarded-allow-ips naming the proxy, X-Forwarded-For's client is the
    one limited; from any other peer the header is not believed."""
    args = ["--auth-failures-per-minute", "2", "--forwarded-allow-ips", "127.0.0.1"]
    with serve_process(db, tmp_path, args) as serve:
        run = f"/runs/{uuid.uuid4()}"
        proxy = httpx.Client(base_url=serve.url, timeout=20)
        other = httpx.Client(
            base_url=serve.url, timeout=20, transport=httpx.HTTPTransport(local_address="127.0.0.2")
        )
        with proxy, other:
            guesser = {**WRONG, "X-Forwarded-For": "203.0.113.7"}
            guessed = [proxy.get(run, headers=guesser).status_code for _ in range(3)]
            # Another client through the same proxy is not the guesser.
            neighbour = proxy.get(run, headers={**WRONG, "X-Forwarded-For": "203.0.113.8"}).status_code
            # An untrusted peer cannot pose as a fresh address: it is limited as itself.
            posing = [
                other.get(run, headers={**WRONG, "X-Forwarded-For": f"198.51.100.{i}"}).status_code
                for i in range(3)
            ]
    assert guessed == [401, 401, 429]
    assert neighbour == 401
    assert posing == [401, 401, 429]


def test_a_forwarded_allow_ips_item_that_is_no_address_is_a_usage_error() -> None:
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "pyworker", "serve", "--forwarded-allow-ips", "10.0.0.5,prxy"],
        env={**os.environ, "RUNROW_TOKENS": "aaaaaaaaaaaaaaaa=alice"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "item 2 ('prxy') is not an IP address or network" in result.stderr, result.stderr
