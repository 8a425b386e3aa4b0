"""pyworker/db/ids.py: UUIDv7 as RFC 9562 lays it out, time-ordered across milliseconds."""

from __future__ import annotations

import time
import uuid

from pyworker.db.ids import uuid7


def test_a_uuid7_is_version_7_of_the_rfc_variant_with_the_time_first() -> None:
    before = time.time_ns() // 1_000_000
    made = uuid7()
    after = time.time_ns() // 1_000_000
    assert made.version == 7 and made.variant == uuid.RFC_4122
    assert before <= made.int >> 80 <= after
    assert uuid.UUID(str(made)) == made


def test_ids_of_later_milliseconds_sort_after_and_the_rest_is_random() -> None:
    first = uuid7()
    time.sleep(0.002)
    second = uuid7()
    assert str(first) < str(second) and first.int < second.int
    # 74 random bits: a thousand ids of one process never repeat, and differ past the time.
    many = {uuid7() for _ in range(1000)}
    assert len(many) == 1000
    assert len({u.int & ((1 << 62) - 1) for u in many}) == 1000
