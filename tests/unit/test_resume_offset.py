"""Where a group member reads a partition from when it takes it (`resume_offset`): its
committed offset, or the start; records deleted before the group read them (a committed
offset below the partition's start) are read past from the start, and said as an error,
never skipped as if nothing was missed. The same on the in-memory group as on Kafka
(`tests/integration/test_poll_loop_kafka.py`)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.kafka.memory import MemoryLog
from app.kafka.resume_offset import resume_offset

TOPIC = "log"


@given(st.one_of(st.none(), st.integers(-5, 1_000)), st.integers(0, 1_000))
def test_reads_from_the_committed_offset_never_below_the_start(
    committed: int | None, start: int
) -> None:
    offset = resume_offset(TOPIC, 0, committed, start)
    if committed is None or committed < 0:
        assert offset == start
    else:
        assert offset == max(committed, start)


def test_records_deleted_unread_are_an_error_naming_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="app.kafka.resume_offset"):
        assert resume_offset(TOPIC, 3, 2, 6) == 6
        assert resume_offset(TOPIC, 3, 6, 6) == 6 and resume_offset(TOPIC, 3, None, 6) == 6
    (error,) = caplog.records
    assert error.levelno == logging.ERROR
    assert "log[3]: 4 records were deleted before this group read them" in error.getMessage()


async def test_a_memory_group_member_rewound_below_the_start_reads_on_from_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryLog()
    log.create_topic(TOPIC, 1)
    for i in range(10):
        await log.publisher().send(TOPIC, b"k", b"%d" % i, 0)

    async def nothing(_: set[tuple[str, int]]) -> None:
        return None

    member = log.group_member("g", [TOPIC], on_assigned=nothing, on_revoked=nothing)
    await member.start()
    try:
        await member.commit({(TOPIC, 0): 2})
        log.delete_records(TOPIC, 0, 6)
        with caplog.at_level(logging.ERROR, logger="app.kafka.resume_offset"):
            assert await member.rewind([(TOPIC, 0)]) == {(TOPIC, 0): 6}
        assert "4 records were deleted" in caplog.text
        got = await member.poll(100)
        assert [r.offset for r in got[(TOPIC, 0)]] == [6, 7, 8, 9]
    finally:
        await member.stop()
