"""Which failures end a run at once instead of handing it back for another attempt.

A released run is claimed again and does the same work again: it calls the model again (and
pays for it). That is right for a failure that may pass (a lost connection, a serialization
failure, an overloaded API), and wrong for one that will recur identically on every attempt:
the database refusing the run's own data (class 22, a check or NOT NULL violation, a program
limit), text that cannot be encoded for the database, or a handler saying so by raising
`DeterministicFailure`. Those end the run `failed` once, with an error that says what happened.
A transient database error (a restart, a failover) does not get this far: the call that met it
is made again in place (pyworker/db/retry.py), and the run keeps its attempt.
"""

from __future__ import annotations

import psycopg

from pyworker.worker.journal import JournalError

# SQLSTATEs outside class 22 (data exception) that the same input always raises again.
_DETERMINISTIC_STATES = {
    "23502",  # not_null_violation
    "23514",  # check_violation
}
_DETERMINISTIC_CLASSES = ("22", "54")  # data exception, program limit exceeded


class DeterministicFailure(Exception):
    """This attempt failed in a way every attempt would: end the run failed, do not retry.
    The message is the run's error; say what happened and to what."""


def deterministic(exc: BaseException) -> str | None:
    """The run's error if `exc` would recur identically on another attempt, else None.

    Follows explicit causes (`raise ... from exc`, as JournalError does for rejected events), not
    the implicit context: an error raised while handling another is judged on its own."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DeterministicFailure):
            return str(current)
        if isinstance(current, psycopg.Error) and _refused_data(current):
            return _describe(exc, current)
        if isinstance(current, UnicodeEncodeError):
            return f"text of this run cannot be sent to the database: {current}"
        current = current.__cause__
    return None


def _refused_data(exc: psycopg.Error) -> bool:
    state = exc.sqlstate
    if state is None:
        # Refused by psycopg before it reached the server (a NUL in a text parameter).
        return isinstance(exc, psycopg.DataError)
    return state.startswith(_DETERMINISTIC_CLASSES) or state in _DETERMINISTIC_STATES


def _describe(outer: BaseException, db: psycopg.Error) -> str:
    what = db.diag.message_primary or str(db)
    if db.diag.message_detail:
        what = f"{what} ({db.diag.message_detail})"
    if db.sqlstate:
        what = f"SQLSTATE {db.sqlstate}: {what}"
    if isinstance(outer, JournalError):
        context = "the journal refused this run's events"
    elif outer is db:
        context = "the database refused this run's data"
    else:
        context = str(outer)
    return f"{context}; not retried, every attempt would fail the same way: {what}"
