"""argparse types shared by the commands: a value that cannot work is a usage error (exit 2)
naming the option and what it takes, before anything starts, never a traceback later."""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from pyworker.cli.messages import unparsable_url_reason

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return port


def log_level(text: str) -> str:
    """A level name of the logging module, in any case (also from RUNROW_LOG_LEVEL)."""
    level = text.strip().upper()
    if level not in LOG_LEVELS or not isinstance(logging.getLevelName(level), int):
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def number(kind: type[int] | type[float], lo: float, hi: float, unit: str = "") -> Callable[[str], float]:
    """A finite int or float from lo to hi: `inf`, `nan` and values past what the option's
    consumer can hold (a timedelta, a socket, a pool) are refused here, by name."""
    what = "an integer" if kind is int else "a number"
    suffix = f" {unit}" if unit else ""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        finite = value is not None and (kind is int or math.isfinite(value))
        if not finite or not lo <= value <= hi:  # type: ignore[operator]
            span = f"from {_bound(lo)} to {_bound(hi)}{suffix}"
            raise argparse.ArgumentTypeError(f"must be {what} {span}, got {text!r}")
        return value

    return parse


def _bound(x: float) -> str:
    """A range's end as people write it: 86400, 0.1, 2147483647 (not 8.64e+04 or 2.14748e+09)."""
    return str(int(x)) if x == int(x) else f"{x:g}"


def int32(text: str) -> int:
    """An integer a SQL `integer` argument can take; the function's own range is its to name.
    (A larger Python int is sent as bigint or numeric, and PostgreSQL then finds no function.)"""
    return int(number(int, -(2**31), 2**31 - 1)(text))


def int64(text: str) -> int:
    """An integer a SQL `bigint` argument can take."""
    return int(number(int, -(2**63), 2**63 - 1)(text))


def not_utf8(argv: list[str]) -> str | None:
    """The first argument that is not valid UTF-8 (Python decodes such bytes of argv to lone
    surrogates, which no database text or file name can take), named by its option."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            before = argv[i - 1] if i > 0 and argv[i - 1].startswith("-") and "=" not in arg else None
            name = arg.split("=", 1)[0] if arg.startswith("--") and "=" in arg else before
            where = f"the value of {name}" if name else f"argument {i + 1}"
            return f"{where} is not valid UTF-8: {arg.encode('utf-8', 'surrogateescape')!r}"
    return None


class FromEnv(str):
    """An option's default read from an environment variable, which remembers the variable."""

    var: str


def env_default(var: str, fallback: str | None = None, *, empty_is_unset: bool = False) -> str | None:
    """The value of `var` as an option's default (fallback when it is unset, or empty and
    empty_is_unset). name_env_defaults makes a type that refuses it name the variable."""
    value = os.environ.get(var)
    if value is None or (empty_is_unset and not value):
        return fallback
    default = FromEnv(value)
    default.var = var
    return default


def name_env_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option of `parser` and its subcommands whose default came from env_default reports
    a refused value with the variable it came from: RUNROW_CONCURRENCY=0 was refused as
    "argument --concurrency: ...", a flag the user had not typed."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in {id(p): p for p in action.choices.values()}.values():
                name_env_defaults(command)
        elif isinstance(action.default, FromEnv) and callable(action.type):
            action.type = _naming_env(action.type)


def _naming_env(parse: Callable[[str], object]) -> Callable[[str], object]:
    def parse_or_name(text: str) -> object:
        try:
            return parse(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            if not isinstance(text, FromEnv):
                raise
            why = str(exc) if isinstance(exc, argparse.ArgumentTypeError) else f"invalid value {text!r}"
            raise argparse.ArgumentTypeError(f"{why} (from ${text.var})") from None

    parse_or_name.__name__ = getattr(parse, "__name__", "value")
    parse_or_name.never_shown = getattr(parse, "never_shown", False)  # type: ignore[attr-defined]
    return parse_or_name


MAX_SDK_RETRIES = 100


def sdk_retries_problem() -> str | None:
    """Why RUNROW_MAX_RETRIES (the Anthropic client's own retries per request) cannot work, or
    None. Read by the agent at its first model call: a bad value failed every run there, one by
    one, with a ValueError, so the commands that call the model check it before they start."""
    raw = os.environ.get("RUNROW_MAX_RETRIES")
    if raw is None or (re.fullmatch(r"[0-9]{1,3}", raw.strip()) and int(raw) <= MAX_SDK_RETRIES):
        return None
    return f"RUNROW_MAX_RETRIES must be a whole number from 0 to {MAX_SDK_RETRIES}, got {raw[:40]!r}"


def worker_id(text: str) -> str:
    """claim_runs' worker_id: 1 to 200 characters. A longer one started a worker whose every
    claim was refused, so it never claimed a run."""
    if not 1 <= len(text) <= 200:
        raise argparse.ArgumentTypeError(f"must be 1 to 200 characters, got {len(text)}")
    return text


def conninfo(text: str) -> str:
    """A PostgreSQL URL or conninfo string that libpq can parse. One that cannot was tried by a
    pool for 30 s before anything said why (--replica-url, --listen-url), or never said at all:
    the LISTEN connection retries in the background while the process polls. The value is not
    repeated in the message, since a URL may hold a password."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    if not text.strip():
        # libpq parses "" (every parameter left to its default), and the commands then took it
        # as not given: `--listen-url "$DIRECT_URL"` with the variable unset listened through
        # the pooler of --database-url, and `--replica-url ""` read streams from the primary.
        raise argparse.ArgumentTypeError(
            "is empty (an unset shell variable?): give a URL or leave the option out"
        )
    try:
        conninfo_to_dict(text)
    except psycopg.Error as exc:
        reason = unparsable_url_reason(exc)
        raise argparse.ArgumentTypeError(
            "must be a PostgreSQL URL (postgresql://user@host/db) or conninfo string "
            f"(host=… dbname=…): {reason}"
        ) from None
    return text


def database_url_option(text: str) -> str:
    """--database-url: a URL libpq can parse, and not blank. A blank one was taken as not given:
    `runrow --database-url "$PROD_URL" migrate` with PROD_URL unset migrated whatever
    DATABASE_URL or .runrow/db.json pointed at, and said nothing (conninfo refuses it)."""
    return conninfo(text)


def host_name(text: str) -> str:
    """An address to bind: not empty (an empty one bound every interface, 0.0.0.0 and ::, without
    anyone asking for it), no white space."""
    if not text or text != text.strip():
        raise argparse.ArgumentTypeError(
            f"must be a host name or address (0.0.0.0 for every interface), got {text!r}"
        )
    return text


def secret(if_left_out: str) -> Callable[[str], str]:
    """A secret option (a webhook signing key): not empty, and UTF-8, since its UTF-8 bytes are
    the HMAC key. '' turned webhook delivery off without a word, as if no secret had been given
    (an environment variable set to '' still means none: env_default's empty_is_unset), and an
    environment variable holding other bytes raised UnicodeEncodeError at every signature. The
    value is never repeated in a message."""

    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"must not be empty: {if_left_out}")
        try:
            text.encode()
        except UnicodeEncodeError:
            raise argparse.ArgumentTypeError("must be UTF-8 text (its bytes are the HMAC key)") from None
        return text

    parse.__name__ = "secret"
    parse.never_shown = True  # type: ignore[attr-defined]  # --help shows no default (its value)
    return parse


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def add_log_format(p: argparse.ArgumentParser, json_help: str) -> None:
    """--log-format of a command that logs (the worker, serve): one definition, so every such
    command takes the same values from the same variable and hands them to logs.setup."""
    p.add_argument(
        "--log-format",
        # A type, not choices: argparse checks a default against neither, and a string default
        # goes through the type, so RUNROW_LOG_FORMAT=xml is refused too.
        type=one_of("text", "json"),
        metavar="{text,json}",
        default=env_default("RUNROW_LOG_FORMAT", "text"),
        help=f"json: {json_help} (env RUNROW_LOG_FORMAT)",
    )


# The largest USD amount an option takes (exclusive), and its finest fraction. Decimal reads
# 1e400 or 1e-400 exactly and the SQL numeric arguments store them: a budget of 1e400 USD was
# "set" (and shown as a 400-digit column), 1e200000 was a database error 22003 naming nothing,
# and 1e-400 a price no spend could ever reach. No price or budget needs more than these.
USD_BELOW = Decimal(10) ** 15
USD_PLACES = 15


def usd(text: str) -> Decimal:
    """An amount of USD: a finite decimal below USD_BELOW in magnitude with at most USD_PLACES
    decimal places (the SQL functions say which sign they take)."""
    try:
        value = Decimal(text)
    except InvalidOperation as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if not value.is_finite():
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    exact = value.normalize()
    if abs(value) >= USD_BELOW or (value and exact.as_tuple().exponent < -USD_PLACES):  # type: ignore[operator]
        raise argparse.ArgumentTypeError(
            f"must be an amount of USD below {USD_BELOW:f} with at most {USD_PLACES} decimal places, "
            f"got {text[:40]!r}"
        )
    return value
