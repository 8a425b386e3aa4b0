"""Who can sign a webhook delivery, and how a receiver checks it: the Runrow-Signature header and
the per-user keys. A module of its own, with nothing but the standard library, so that a receiver
(and `runrow webhooks user-secret`) imports it without the sender's HTTP client.

Signing follows Stripe's scheme so receivers can reuse what they know:
    Runrow-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(key, "<t>.<raw body>")>[,v1=...]
with one v1 per key the sender signs with (README "Webhooks"): the fleet secret, a user's key
derived from it, and during a rotation the same from the previous secret.

A user's key is derived, never stored: whoever holds the fleet secret computes any user's key,
and a user holding its own key computes neither the fleet secret nor another user's key (HMAC is
a pseudorandom function). Spelled out for other languages, with UTF-8 for every string:
    user key    = "whsec_" + hex(HMAC-SHA256(key=fleet secret, msg="runrow-webhook-user:" + user_id))
    no-user key = "whsec_" + hex(HMAC-SHA256(key=fleet secret, msg="runrow-webhook-no-user"))
and the whole string, "whsec_" included, is the HMAC key a receiver verifies with, as the fleet
secret was. The labels keep the three uses apart: a signed delivery's message starts with the
digits of t, so no v1 ever sent is any user's key.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable

SIGNATURE_HEADER = "Runrow-Signature"
DEFAULT_TOLERANCE = 300.0  # seconds a receiver accepts between t and its own clock (Stripe's default)
USER_KEY_PREFIX = "whsec_"
_USER_LABEL = "runrow-webhook-user:"
_NO_USER_LABEL = "runrow-webhook-no-user"


class SignatureError(ValueError):
    """The Runrow-Signature header does not prove the body came from a holder of the key."""


def derive_user_secret(secret: str, user_id: str | None) -> str:
    """The key that signs the deliveries of `user_id`'s runs under `--webhook-signing user` (or
    `both`), derived from the fleet `secret`: what `runrow webhooks user-secret USER_ID` prints.
    `user_id` exactly as the delivery body's "user_id" (no normalisation: "Zoë" composed and
    decomposed are two users); None for the runs that have no user (the body's user_id is null).
    ValueError for an empty secret or user_id: no run has the empty user, and an empty shell
    variable must not hand out a key."""
    if not secret:
        raise ValueError("the webhook secret must not be empty")
    if user_id == "":
        raise ValueError("user_id must not be empty (None: the runs that have no user)")
    label = _NO_USER_LABEL if user_id is None else _USER_LABEL + user_id
    return USER_KEY_PREFIX + hmac.new(secret.encode(), label.encode(), hashlib.sha256).hexdigest()


def signature_header(keys: str | Iterable[str], timestamp: int, body: bytes) -> str:
    """The Runrow-Signature value for `body` sent at `timestamp` (unix seconds): one v1 per key,
    in the order given, each once."""
    keys = [keys] if isinstance(keys, str) else list(dict.fromkeys(keys))
    if not keys:
        raise ValueError("a signature needs at least one key")
    return ",".join([f"t={timestamp}", *(f"v1={_mac(k, timestamp, body)}" for k in keys)])


def _mac(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    header: str | None,
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> int:
    """For receivers: check the Runrow-Signature `header` against the raw request `body` (the
    bytes as received, before any JSON parsing) with `secret` (the fleet secret, or the key
    derive_user_secret gives for this receiver's user). Returns the signed timestamp; raises
    SignatureError when the header is missing or malformed, no v1 matches, or t is more than
    `tolerance` seconds from `now` (default: this machine's clock), which stops replays."""
    if not header:
        raise SignatureError(f"no {SIGNATURE_HEADER} header")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t" and value.isdigit() and value.isascii():
            timestamp = int(value)
        elif key == "v1" and value.isascii():
            # hmac.compare_digest raises TypeError on non-ASCII str: a receiver that caught
            # SignatureError, as the README shows, answered 500 (the security audit).
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError(f"{SIGNATURE_HEADER} must be t=<unix seconds>,v1=<hex digest>")
    expected = _mac(secret, timestamp, body)
    # Every v1 is compared (in constant time): the sender sends one per key it signs with.
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("no v1 signature matches the body")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureError(f"timestamp {timestamp} is more than {tolerance:g} s from now")
    return timestamp
