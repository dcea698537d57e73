"""The topic catalog when its listing fails or never answers: a miss is answered "missing"
only by a listing that succeeded after it was asked; otherwise the caller is told the
answer is unknown (`KafkaUnavailable`, a transient send failure), never NO_TARGET, and a
listing that hangs is given up after `list_timeout_ms` of the catalog's clock (a fake one
here, which the tests move on: nothing waits for real time), so the next miss lists again."""

from __future__ import annotations

import asyncio

import pytest
from fakes import T0, FakeClock, wait_until

from app.errors import KafkaUnavailable
from app.kafka.catalog import LIST_TIMEOUT_MS, TopicCatalog
from app.kafka.records import TOPIC_RECORD_BYTES


class _Listings:
    """A cluster's topic list on a fake clock; each listing answers, fails or hangs."""

    def __init__(self, names: set[str]) -> None:
        self.clock = FakeClock(T0)
        self.names = names
        self.calls = 0
        self.fail = False
        self.hang = False
        self.misses: list[str] = []
        self.catalog = TopicCatalog(
            self.list_topics,
            self.clock.now,
            min_interval_ms=1_000,
            on_missing=self.misses.append,
            sleep_ms=self.sleep_ms,
        )

    async def list_topics(self) -> set[str]:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()  # never answers
        if self.fail:
            raise KafkaUnavailable("the broker is not reachable")
        return set(self.names)

    async def sleep_ms(self, ms: int) -> None:
        await self.clock.sleep_until(self.clock.now() + ms)

    async def deadline_passes(self) -> None:
        """Moves the clock to the hung listing's deadline: just short of it first."""
        deadline = self.clock.now() + LIST_TIMEOUT_MS
        await wait_until(lambda: self.clock.sleeping_until == [deadline])
        self.clock.advance(LIST_TIMEOUT_MS - 1)
        for _ in range(5):
            await asyncio.sleep(0)
        assert self.calls > 0 and self.catalog._task is not None
        assert not self.catalog._task.done(), "given up before its deadline"
        self.clock.advance(1)


async def test_a_miss_whose_listing_fails_is_unknown_not_missing() -> None:
    c = _Listings({"a.b.commands"})
    await c.catalog.refresh()
    c.names.add("c.d.commands")  # created after the last good listing
    c.clock.advance(5_000)
    c.fail = True
    with pytest.raises(KafkaUnavailable, match=r"c\.d\.commands"):
        await c.catalog.exists("c.d.commands")
    assert c.calls == 2 and c.misses == [], "never counted as a missing target"
    # A topic the list has is still answered from it while the listings fail.
    assert await c.catalog.exists("a.b.commands") and c.calls == 2
    # The listing works again: the next miss lists again and finds the topic.
    c.fail = False
    c.clock.advance(1_000)
    assert await c.catalog.exists("c.d.commands") and c.calls == 3
    await c.catalog.stop()


async def test_a_miss_before_any_listing_whose_listing_fails_is_unknown() -> None:
    c = _Listings({"a.b.commands"})
    c.fail = True
    with pytest.raises(KafkaUnavailable):
        await c.catalog.exists("a.b.commands")
    assert c.calls == 1
    await c.catalog.stop()


async def test_a_missing_topic_is_still_refused_by_a_listing_that_succeeded() -> None:
    c = _Listings({"a.b.commands"})
    await c.catalog.refresh()
    c.fail = True
    c.clock.advance(1_000)
    with pytest.raises(KafkaUnavailable):
        await c.catalog.exists("x.y.commands")
    c.fail = False
    c.clock.advance(1_000)
    assert not await c.catalog.exists("x.y.commands") and c.misses == ["x.y.commands"]
    await c.catalog.stop()


async def test_a_listing_that_never_answers_is_given_up_and_the_next_miss_lists_again() -> None:
    """Given up at `list_timeout_ms` on the catalog's clock, which the test moves on."""
    c = _Listings({"a.b.commands"})
    c.hang = True
    async with asyncio.timeout(5):  # a regression fails here rather than hanging the run
        waiting = [asyncio.ensure_future(c.catalog.exists("a.b.commands")) for _ in range(3)]
        await c.deadline_passes()
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(o, KafkaUnavailable) for o in outcomes), outcomes
    assert f"{LIST_TIMEOUT_MS} ms" in str(outcomes[0]), outcomes
    assert c.calls == 1, "the misses shared the one listing"
    c.hang = False
    c.clock.advance(1_000)
    assert await c.catalog.exists("a.b.commands") and c.calls == 2
    await c.catalog.stop()


async def test_a_background_listing_that_hangs_does_not_keep_the_list_stuck() -> None:
    c = _Listings({"a.b.commands"})
    await c.catalog.refresh()
    c.hang = True
    c.clock.advance(1_000)
    assert c.catalog.missing("x.y.commands")  # answered at once; lists in the background
    async with asyncio.timeout(5):
        joined = asyncio.ensure_future(c.catalog.refresh())  # joins that listing
        await c.deadline_passes()
        assert not await joined, "given up"
    assert c.calls == 2
    c.hang = False
    c.names.add("x.y.commands")
    c.clock.advance(1_000)
    assert c.catalog.missing("x.y.commands")  # from the last good list; lists again
    await c.catalog.refresh()  # joins that listing
    assert c.calls == 3 and c.catalog.known("x.y.commands")
    await c.catalog.stop()


async def test_a_clock_stepped_back_neither_stops_the_listings_nor_makes_a_miss_wait_the_step() -> (
    None
):
    # NTP steps the node's clock back an hour after a listing: before, the catalog found its
    # listing fresh for that hour (a topic created since stayed missing) and a miss slept
    # the hour out before it listed again.
    now = [T0]
    names = {"a.x.commands"}
    listings: list[int] = []
    slept: list[int] = []

    async def list_topics() -> set[str]:
        listings.append(now[0])
        return set(names)

    async def sleep_ms(ms: int) -> None:
        slept.append(ms)
        await asyncio.sleep(0)

    catalog = TopicCatalog(list_topics, lambda: now[0], min_interval_ms=1_000, sleep_ms=sleep_ms)
    try:
        assert await catalog.refresh()
        now[0] -= 3_600_000
        names.add("b.y.commands")  # created since
        assert await asyncio.wait_for(catalog.exists("b.y.commands"), 5)
        assert len(listings) == 2
        assert all(ms <= LIST_TIMEOUT_MS for ms in slept), slept  # its listings' deadlines
    finally:
        await catalog.stop()


async def _no_topics() -> set[str]:
    return set()


class _Limits:
    """A cluster's `max.message.bytes` by topic, read in batches (`read_limits`): a topic
    it does not name is refused (no DescribeConfigs on it); `down` fails a whole read."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.reads: list[list[str]] = []
        self.down = False

    async def __call__(self, topics: list[str]) -> dict[str, int | None]:
        self.reads.append(list(topics))
        await asyncio.sleep(0)
        if self.down:
            raise KafkaUnavailable("the broker is away")
        return {t: self.limits.get(t) for t in topics}


async def test_what_a_topic_takes_is_read_in_the_background_and_again_once_stale() -> None:
    """Unread: what a topic of the broker's defaults takes, answered at once, the read
    begun (one read for the topics asked together, none asked twice while it runs); read,
    its `max.message.bytes` less framing (never more than the default); read again once
    `max_age_ms` old; unreadable: the default, read again later."""
    clock = FakeClock(T0)
    cluster = _Limits({"a": 65_536, "big": 10_000_000})
    catalog = TopicCatalog(_no_topics, clock.now, read_limits=cluster)
    default = TOPIC_RECORD_BYTES
    assert [catalog.takes(t) for t in ("a", "big", "denied", "a")] == [default] * 4
    await wait_until(lambda: catalog.takes("a") != default)
    assert cluster.reads == [["a", "big", "denied"]]
    assert [catalog.takes(t) for t in ("a", "big", "denied")] == [65_536 - 512, default, default]
    cluster.limits["a"] = 32_768
    clock.advance(catalog.max_age_ms)
    assert catalog.takes("a") == 65_536 - 512  # the last read, while it is read again
    await wait_until(lambda: catalog.takes("a") == 32_768 - 512)
    await catalog.stop()


async def test_a_read_that_fails_keeps_what_the_last_one_said() -> None:
    clock = FakeClock(T0)
    cluster = _Limits({"a": 8_192})
    catalog = TopicCatalog(_no_topics, clock.now, read_limits=cluster)
    assert await catalog.read_takes("a") == 8_192 - 512
    cluster.down = True
    clock.advance(catalog.max_age_ms)
    assert await catalog.read_takes("a") == 8_192 - 512  # not the default
    del cluster.limits["a"]  # refused now
    cluster.down = False
    assert await catalog.read_takes("a") == 8_192 - 512
    await catalog.stop()


async def test_without_a_reader_every_topic_takes_the_default_and_nothing_is_read() -> None:
    catalog = TopicCatalog(_no_topics, FakeClock(T0).now)
    assert catalog.takes("a") == TOPIC_RECORD_BYTES
    assert await catalog.read_takes("a") == TOPIC_RECORD_BYTES
    await catalog.stop()


async def test_the_nodes_own_limits_are_kept_current_by_each_read() -> None:
    """Lowered since the start: kept; raised to the default or past: dropped (the default
    is assumed); unreadable: left as read at the start; another's topic: never kept."""
    cluster = _Limits({"lowered": 16_384, "raised": 2_000_000, "other": 8_192})
    catalog = TopicCatalog(_no_topics, FakeClock(T0).now, read_limits=cluster)
    kept = {"raised": 65_024, "denied": 32_256}
    catalog.keep_current(kept, ["lowered", "raised", "denied"])
    for topic in ("lowered", "raised", "denied", "other"):
        await catalog.read_takes(topic)
    assert kept == {"lowered": 16_384 - 512, "denied": 32_256}
    await catalog.stop()
