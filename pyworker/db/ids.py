"""Time-ordered ids for what a client names itself: a new conversation.

A conversation's id is the client's to choose, and runrow indexes finished runs by it (its
history, turn order). Random (version 4) ids put each finished turn's index entry on a random
leaf page of an index as large as the history, a page nobody has touched since the last
checkpoint, which PostgreSQL then logs whole: with 200,000 runs done before, 0.064 full-page
images per run on `agent_run_ended_by_conversation` (bench/wal_history.py's breakdown). A
UUIDv7 (RFC 9562) begins with the Unix time in milliseconds, so a new conversation's entries
land beside other recent ones: 0.0001 with the same history. `runrow._uuidv7()` makes run and
message ids the same way in SQL; Python 3.11's `uuid` module has no version 7.

The time in the id only places it; nothing reads it back (the database clock stays the only
clock for leases, backoff and schedules).
"""

from __future__ import annotations

import os
import time
import uuid

_VERSION = 0x7 << 76  # bits 76-79
_VARIANT = 0x2 << 62  # bits 62-63: RFC 9562's variant, 10


def uuid7() -> uuid.UUID:
    """The Unix time in milliseconds (48 bits), version 7, the RFC variant and 74 random bits."""
    millis = time.time_ns() // 1_000_000
    value = (millis & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | _VERSION
    value = (value & ~(0x3 << 62)) | _VARIANT
    return uuid.UUID(int=value)
