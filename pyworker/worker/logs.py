"""Logging setup: `text` for people, `json` (one object per line) for log pipelines, for the
worker and `runrow serve` alike (uvicorn's own lines included).

Every line about a run carries run_id, conversation_id and attempt: run code logs through
`run_logger(run)`, a LoggerAdapter that puts them on the record; both formats print them.

A worker logs two lines per run at INFO, so what each record costs is worker CPU per run:
neither format prints where a record was made nor its thread or process, so `setup` turns off
gathering them (the "Optimization" switches of the logging docs), the timestamp's date and
time are rendered once a second, not once a record, the text line is put together without the
format string's style machinery, and a line written to a stream that writes through (sys.stderr)
is not flushed again. A line through `run_logger` at INFO costs about 75,600 instructions (86,700
before the last two, counted under callgrind).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any

RUN_FIELDS = ("run_id", "conversation_id", "attempt", "worker_id")
# The record attribute (a dict) an HTTP access line carries; json prints it as an object.
HTTP_FIELD = "http"
# uvicorn's loggers. `runrow serve` runs uvicorn with log_config=None, so nothing gives them a
# handler of their own: setup makes sure they have none and propagate, so their lines go out
# through runrow's handler in runrow's format (a JSON pipeline parsed none of uvicorn's).
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class RunLoggerAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Merges the run's fields into each record's `extra` (the stdlib adapter replaces them)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = kwargs.get("extra")
        # makeRecord only reads `extra`: the run's own dict serves unless the call adds fields.
        kwargs["extra"] = {**(self.extra or {}), **extra} if extra else self.extra
        return msg, kwargs


def run_logger(run: Any, worker_id: str | None = None, name: str = "runrow.run") -> RunLoggerAdapter:
    extra = {"run_id": str(run.run_id), "conversation_id": str(run.conversation_id), "attempt": run.attempt}
    if worker_id is not None:
        extra["worker_id"] = worker_id
    return RunLoggerAdapter(logging.getLogger(name), extra)


class _Formatter(logging.Formatter):
    """formatTime as the stdlib's, with the strftime of the current second kept: records come
    many a second, and strftime is most of a record's timestamp."""

    _second: tuple[int, str | None] | None = None
    _stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        key = (int(record.created), datefmt)
        if key != self._second:
            self._stamp = time.strftime(datefmt or self.default_time_format, self.converter(key[0]))
            self._second = key
        if datefmt or not self.default_msec_format:
            return self._stamp
        return self.default_msec_format % (self._stamp, record.msecs)


class JsonFormatter(_Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in RUN_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                out[field] = value
        # An access line's method, path, status, duration and client, as fields a log pipeline
        # can filter on (`runrow serve --access-log`); one lookup, not one per field, per record.
        http = getattr(record, HTTP_FIELD, None)
        if http is not None:
            out[HTTP_FIELD] = http
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(_Formatter):
    """`%(asctime)s %(levelname)s %(name)s %(message)s`, then the run's fields: the line is
    put together here, with the stdlib Formatter's text, not through its style machinery."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        line = f"{record.asctime} {record.levelname} {record.name} {record.message}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line = f"{line}\n{record.exc_text}"
        if record.stack_info:
            line = f"{line}\n{self.formatStack(record.stack_info)}"
        fields = [f"{f}={getattr(record, f)}" for f in RUN_FIELDS[:3] if getattr(record, f, None) is not None]
        return f"{line} [{' '.join(fields)}]" if fields else line


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that skips the flush after each line when its stream writes through
    (sys.stderr since Python 3.9): the line is already on the file descriptor."""

    def flush(self) -> None:
        if not getattr(self.stream, "write_through", False):
            super().flush()


def setup(log_format: str = "text", level: str = "INFO") -> None:
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # Neither format has %(filename)s, %(lineno)d, %(funcName)s, %(thread)d, %(process)d or
    # %(processName)s: skip the stack walk (findCaller) and the lookups each record made for them.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.getLogger("yoyo").setLevel(logging.WARNING)
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
