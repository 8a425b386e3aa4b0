"""The worker's log lines (pyworker/worker/logs.py): the text and json formats with the run's
fields, and what a record costs — two INFO lines per run, so no stack walk for a caller nobody
prints, and the timestamp's strftime once a second, not once a record."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from pyworker.worker import logs

RUN = SimpleNamespace(run_id=uuid.uuid4(), conversation_id=uuid.uuid4(), attempt=2, max_attempts=3)


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """What `setup` below writes; the logging module's globals and root handlers put back after."""
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    yield out
    root.handlers[:] = handlers
    root.setLevel(level)


def setup(fmt: str, out: io.StringIO) -> logging.StreamHandler:  # type: ignore[type-arg]
    """logs.setup, its handler's stream swapped for `out` (pytest owns sys.stderr in a test)."""
    logs.setup(fmt, "INFO")
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)
    return handler


def test_text_lines_carry_the_time_level_logger_message_and_run_fields(stream: io.StringIO) -> None:
    setup("text", stream)
    log = logs.run_logger(RUN, "w1")
    log.info("run claimed (attempt %s of %s)", RUN.attempt, RUN.max_attempts)
    log.info("with more", extra={"note": 1})
    logging.getLogger("runrow.worker").info("no run")
    first, second, third = stream.getvalue().splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    fields = f"run_id={RUN.run_id} conversation_id={RUN.conversation_id} attempt=2"
    assert re.fullmatch(rf"{stamp} INFO runrow.run run claimed \(attempt 2 of 3\) \[{fields}\]", first)
    assert re.fullmatch(rf"{stamp} INFO runrow.run with more \[{fields}\]", second)
    assert re.fullmatch(rf"{stamp} INFO runrow.worker no run", third)


def test_json_lines_carry_the_run_fields_and_millisecond_timestamps(stream: io.StringIO) -> None:
    setup("json", stream)
    logs.run_logger(RUN, "w1").info("run finished: %s", "completed")
    (line,) = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}", line["ts"])
    assert line["msg"] == "run finished: completed" and line["level"] == "INFO"
    assert (line["run_id"], line["conversation_id"], line["attempt"], line["worker_id"]) == (
        str(RUN.run_id),
        str(RUN.conversation_id),
        2,
        "w1",
    )


def test_a_record_skips_the_caller_lookup_neither_format_prints(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks = []
    real = logging.Logger.findCaller
    monkeypatch.setattr(logging.Logger, "findCaller", lambda self, *a: walks.append(1) or real(self, *a))
    for fmt in ("text", "json"):
        setup(fmt, stream)
        logs.run_logger(RUN, "w1").info("run claimed")
        logs.run_logger(RUN, "w1").error("handler raised", exc_info=ValueError("boom"))
    assert walks == []
    assert "ValueError: boom" in stream.getvalue()  # tracebacks are still printed


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_timestamp_is_rendered_once_a_second(
    fmt: str, stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = setup(fmt, stream)
    calls = []
    real = time.strftime
    monkeypatch.setattr(time, "strftime", lambda *a: calls.append(a) or real(*a))
    base = float(int(time.time()))
    stamps = []
    for created in (base + 0.125, base + 0.5, base + 0.75, base + 1.25):
        record = logging.LogRecord("runrow.run", logging.INFO, __file__, 1, "m", None, None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        stamps.append(handler.format(record))
    assert len(calls) == 2, calls  # one per second the records fall in
    datefmt = "%Y-%m-%d %H:%M:%S" if fmt == "text" else "%Y-%m-%dT%H:%M:%S"
    local = [real(datefmt, time.localtime(s)) for s in (base, base + 1)]
    sep = "," if fmt == "text" else "."
    expected = [f"{local[0]}{sep}125", f"{local[0]}{sep}500", f"{local[0]}{sep}750", f"{local[1]}{sep}250"]
    assert [s[:23] if fmt == "text" else json.loads(s)["ts"] for s in stamps] == expected


class _Stream(io.StringIO):
    """A text stream that counts its flushes; write_through as sys.stderr's (Python 3.9+) or not."""

    def __init__(self, write_through: bool) -> None:
        super().__init__()
        self.write_through = write_through
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


@pytest.mark.parametrize("write_through", [True, False])
def test_a_line_is_flushed_only_when_the_stream_holds_it_back(
    write_through: bool, stream: io.StringIO
) -> None:
    """sys.stderr writes through: each line is on the descriptor once written, and flushing it
    again is a few Python calls per line for nothing. A buffered stream is still flushed."""
    handler = setup("text", stream)
    out = _Stream(write_through)
    handler.setStream(out)
    for n in range(3):
        logs.run_logger(RUN, "w1").info("line %s", n)
    assert len(out.getvalue().splitlines()) == 3
    assert out.flushes == (0 if write_through else 3)


def test_text_lines_are_the_stdlib_formatters_text(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text format puts its line together itself, not through the format string's style
    machinery, and gives exactly the stdlib Formatter's text for the same format string, a
    traceback and a stack included, followed by the run's fields."""
    handler = setup("text", stream)
    reference = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    fields = {"run_id": "r", "conversation_id": "c", "attempt": 2}
    cases = [({}, None, None), (fields, None, None), (fields, exc_info, None), ({}, None, "Stack:\n  here")]

    def record(extra: dict[str, object], exc: object, stack: str | None) -> logging.LogRecord:
        made = logging.LogRecord("runrow.run", logging.WARNING, __file__, 1, "m %s", ("x",), exc, sinfo=stack)  # type: ignore[arg-type]
        made.__dict__.update(extra)
        made.created, made.msecs = 1_700_000_000.25, 250.0
        return made

    expected = [
        reference.format(record(*case)) + (" [run_id=r conversation_id=c attempt=2]" if case[0] else "")
        for case in cases
    ]
    styled = []
    real = logging.Formatter.formatMessage
    monkeypatch.setattr(logging.Formatter, "formatMessage", lambda self, r: styled.append(1) or real(self, r))
    assert [handler.format(record(*case)) for case in cases] == expected
    assert styled == []
