"""Who is asking: every API request is scoped to one user id.

The check is pluggable (`ServeConfig.authenticate`: a callable `request -> user_id | None`).
The default maps bearer tokens to user ids from configuration (`--tokens-file` JSON
`{"token": "user"}`, or `RUNROW_TOKENS="tok1=alice,tok2=bob"`, each item split at the last '='
of its first run of them, so a base64 token keeps its padding and a user id may hold '=');
`--insecure-dev` accepts every request as user `dev`, or as the user named in its
`X-Runrow-User` header.
"""

from __future__ import annotations

import hmac
import inspect
import json
import re
from collections.abc import Mapping
from pathlib import Path

from starlette.requests import Request

from pyworker.db.printable import first_hidden
from pyworker.http.config import Authenticate, ServeConfig
from pyworker.http.errors import ApiError

DEV_USER = "dev"
# A user id names an owner in runrow.conversation (1..200 characters); keep them printable.
_USER_ID = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")
# RUNROW_TOKENS' item: the token up to its first run of '=' with all but the last of them (the
# padding), then the user.
_TOKEN_ITEM = re.compile(r"([^=]*=*)=(.*)", re.DOTALL)


class TokenConfigError(ValueError):
    """The token configuration is unusable; the message says how to fix it."""


def parse_tokens_env(text: str) -> dict[str, str]:
    """`tok1=alice,tok2=bob` -> {"tok1": "alice", "tok2": "bob"}. A bad item is named by its
    position, never by any of its characters: they may be a token (`garbage` was quoted as
    "garb...", four characters of a secret in a log)."""
    tokens: dict[str, str] = {}
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        # Set, yet no token: `RUNROW_TOKENS=",,"` (a template filled with nothing) was read as no
        # tokens at all, the same as leaving it unset.
        raise TokenConfigError(
            f"RUNROW_TOKENS is set but holds no token ({len(text)} characters of commas and white "
            "space): expected tok1=alice,tok2=bob; unset it to configure none"
        )
    seen: dict[str, int] = {}
    for position, item in enumerate(items, 1):
        where = f"RUNROW_TOKENS: item {position} of {len(items)}"
        # The last '=' of the first run of them: a base64 token (`openssl rand -base64 24`) ends
        # in '=' padding, and split at its first one it lost the padding and its user became
        # "=alice", another tenant; a user id may hold '=' ("team=ops"), as it always could.
        split = _TOKEN_ITEM.fullmatch(item)
        if split is None:
            raise TokenConfigError(f"{where} has no '=user' (expected tok1=alice,tok2=bob)")
        token, user = split.group(1).strip(), split.group(2).strip()
        _checked({token: user}, where)
        if token in seen:
            # The later one won: the earlier user's requests became the later user's.
            raise TokenConfigError(
                f"{where} repeats the token of item {seen[token]}: give each user a token of its own"
            )
        seen[token] = position
        tokens[token] = user
    return _checked(tokens, "RUNROW_TOKENS")


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """json.loads' object_pairs_hook: a token given twice is an error (json keeps the last)."""
    data: dict[str, object] = {}
    for position, (key, value) in enumerate(pairs, 1):
        if key in data:
            raise ValueError(
                f"entry {position} repeats a token given before: give each user a token of its own"
            )
        data[key] = value
    return data


def load_tokens_file(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(), object_pairs_hook=_unique_pairs)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested past the stack
        raise TokenConfigError(f"--tokens-file {path}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise TokenConfigError(f'--tokens-file {path}: expected a JSON object {{"token": "user id", ...}}')
    if not data:
        raise TokenConfigError(f'--tokens-file {path}: holds no token (expected {{"token": "user id", ...}})')
    return _checked(data, f"--tokens-file {path}")


def _checked(tokens: dict[str, str], where: str) -> dict[str, str]:
    for token, user in tokens.items():
        if len(token) < 16:
            raise TokenConfigError(f"{where}: a token of user {user!r} is shorter than 16 characters")
        if not _USER_ID.match(user):
            raise TokenConfigError(f"{where}: user id {user!r} must be 1 to 200 printable characters")
        hidden = first_hidden(user)
        if hidden is not None:
            # enqueue_run refuses such a user_id: every run of the user would have been a 400.
            raise TokenConfigError(
                f"{where}: a user id holds a control or bidirectional formatting character ({hidden})"
            )
    return tokens


def bearer_authenticator(tokens: Mapping[str, str]) -> Authenticate:
    # Compare against every token, always: the time taken says nothing about which one matched.
    pairs = [(token.encode(), user) for token, user in tokens.items()]

    def authenticate(request: Request) -> str | None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return None
        presented = given.strip().encode()
        found = None
        for token, user in pairs:
            if hmac.compare_digest(token, presented):
                found = user
        return found

    return authenticate


def dev_authenticator(request: Request) -> str | None:
    raw = request.headers.get("x-runrow-user")
    if raw is None:
        return DEV_USER
    try:
        # Starlette reads header bytes as latin-1; a browser sends a name's UTF-8 bytes.
        user = raw.encode("latin-1").decode("utf-8").strip()
    except UnicodeError:
        user = ""
    if not _USER_ID.match(user) or first_hidden(user) is not None:
        # Falling back to `dev` would act as someone the caller did not name.
        raise ApiError(
            400,
            "invalid_request",
            "X-Runrow-User must name a user: 1 to 200 printable characters of UTF-8 text",
        )
    return user


def authenticator_for(config: ServeConfig) -> Authenticate:
    if config.authenticate is not None:
        return config.authenticate
    if config.insecure_dev:
        return dev_authenticator
    if not config.tokens:
        raise TokenConfigError(
            'no users configured: pass --tokens-file FILE (JSON {"token": "user"}) or set '
            "RUNROW_TOKENS=tok1=alice,tok2=bob; for a loopback demo, --insecure-dev"
        )
    return bearer_authenticator(config.tokens)


async def user_of(request: Request, authenticate: Authenticate) -> str | None:
    """The authenticated user id of the request, or None."""
    user = authenticate(request)
    if inspect.isawaitable(user):
        user = await user
    return str(user) if user else None


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "unauthorized",
        "missing or invalid bearer token: send Authorization: Bearer <token>",
        headers={"WWW-Authenticate": 'Bearer realm="runrow"'},
    )


def too_many_auth_failures(per_minute: int, retry_after: int) -> ApiError:
    return ApiError(
        429,
        "too_many_auth_failures",
        f"too many failed authentications from this address: {per_minute} a minute at most "
        f"(runrow serve --auth-failures-per-minute); retry in {retry_after} s",
        headers={"Retry-After": str(retry_after)},
    )
