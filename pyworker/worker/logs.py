"""Logging setup: `text` for people, `json` (one object per line) for log pipelines.

Every line about a run carries run_id, conversation_id and attempt: run code logs through
`run_logger(run)`, a LoggerAdapter that puts them on the record; both formats print them.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

RUN_FIELDS = ("run_id", "conversation_id", "attempt", "worker_id")


class RunLoggerAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Merges the run's fields into each record's `extra` (the stdlib adapter replaces them)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def run_logger(run: Any, worker_id: str | None = None, name: str = "runrow.run") -> RunLoggerAdapter:
    extra = {"run_id": str(run.run_id), "conversation_id": str(run.conversation_id), "attempt": run.attempt}
    if worker_id is not None:
        extra["worker_id"] = worker_id
    return RunLoggerAdapter(logging.getLogger(name), extra)


class JsonFormatter(logging.Formatter):
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
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [f"{f}={getattr(record, f)}" for f in RUN_FIELDS[:3] if getattr(record, f, None) is not None]
        return f"{line} [{' '.join(fields)}]" if fields else line


def setup(log_format: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("yoyo").setLevel(logging.WARNING)
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
