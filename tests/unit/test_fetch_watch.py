"""The fetch watch over a reader's polls (`app.kafka.fetch_watch`), beyond a partition whose
fetches all fail (`test_fetch_stalled_readers`): a partition whose fetches are all
answered, waiting behind the others' backlog, was stopped as stalled. aiokafka fetches a
partition again only once its last batch is all handed out, and `getmany`
(max_poll_records) drains the batches partition after partition, so its fetch stamp stood
still for many polls, nothing of it handed out. A node whose group coordinator was away
(each pass of the poll loop hanging in a commit for 30 s) or catching up a backlog was
stopped within a minute or two. Records of it waiting in the client are progress now.

Over aiokafka's real fetcher (its broker a fake, `fakes_fetch`), on the test's clock."""

from __future__ import annotations

import pytest
from fakes_fetch import TOPIC, Broker, Clock, Part, close, over, stamped_by

from app.kafka.group_consumer import GroupConsumer


async def nothing(_: set[tuple[str, int]]) -> None:
    return None


@pytest.mark.parametrize(
    ("partitions", "step_s"),
    [(3, 31.0), (10, 2.0)],
    ids=["coordinator-away", "catching-up"],
)
async def test_a_partition_waiting_behind_a_backlog_is_not_stopped(
    monkeypatch: pytest.MonkeyPatch, partitions: int, step_s: float
) -> None:
    """Each fetch of a partition answered with 50 records, 10 handed out a poll: each
    partition's batch waits behind the others' for polls on end, `step_s` apart (31 s: a
    poll loop whose group commits each hang their 30 s). One more partition, read to its
    end, is answered at every round. None is ever looked at; all are read."""
    clock = Clock()
    stamped_by(monkeypatch, clock)
    parts = {p: Part(records=True, count=50, high=10**6, lso=10**6) for p in range(partitions)}
    parts[partitions] = Part()
    broker = Broker(parts)
    group = GroupConsumer(
        "localhost:9092",
        "g",
        [TOPIC],
        on_assigned=nothing,
        on_revoked=nothing,
        clock=clock,
        max_poll_records=10,
    )
    positions = {p: 0 for p in range(partitions)} | {partitions: 100}
    over(group._consumer, broker, positions, prefetch_backoff=0)
    handed: dict[int, int] = {}
    try:
        for _ in range(20 * partitions):  # each partition's batch waiting four times
            await broker.round()
            clock.now += step_s
            for (_, p), records in (await group.poll(timeout_ms=0)).items():
                handed[p] = handed.get(p, 0) + len(records)
    finally:
        await close(group._consumer)
    assert broker.ends_asked == [], "no partition stood still for the bound"
    assert set(handed) == set(range(partitions))
