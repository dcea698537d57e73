"""Which topics the cluster has: a cached list, so that a command is never sent to a topic
that does not exist.

Brokers run with `auto.create.topics.enable=false`: a send to a missing topic waits for its
metadata (aiokafka: `request_timeout_ms`, 40 s) and then fails. Inside a partition's
transaction that failure aborts the transaction, the partition is taken again, reads the
same input and fails again: one record (a trigger of a timer whose target type is a typo, a
job run into a context not deployed yet) would stall its partition for good. So a decision
or a timer that sends to a topic the catalog does not list is refused instead, as that one
command's failure (`NO_TARGET`), and the partition goes on.

The list is one metadata request naming no topic (`Admin.topic_names`: it never creates
one). It is taken at start, again when it is older than `max_age_ms` (a deleted topic is
noticed), and again on a miss once the last listing is `min_interval_ms` old (a topic
created since is found: the command's retry goes through). At most one listing is in
flight; one that fails, or does not answer within `list_timeout_ms` (given up), is logged,
and the list stays as it was until the next. Both the interval's waits and that deadline
are timed on the catalog's clock (`now`, `sleep_ms`, `timer_ms`), so a fake one drives both.

A caller that may wait (`exists`: a timer's send) is answered a miss only by a listing
begun after it asked that succeeded: a topic created after the last listing is found, never
refused once. When that listing failed the answer is unknown: `KafkaUnavailable`, a send
failure like any other broker trouble (the runner retries it with backoff), never a false
NO_TARGET. Such listings begin at most once per `min_interval_ms` (a miss just after one
waits for the interval's end), and every miss waiting then shares the one listing.
`missing` answers at once from the list (a decision, which cannot wait), listing again in
the background.

It also knows what each topic a decision writes to takes of a record (`takes`), asked
alike: at once, from the last read, a topic not read yet (or read over `max_age_ms` ago)
read in the background. A record over what another context's commands topic takes (made
with a smaller `max.message.bytes`), written in a partition's transaction, fails it: unread,
it was assumed to take what a topic of the broker's defaults does, and the partition was
taken again and failed again on the same command for good. Read by then, the retake
refuses that command (`app.commands.records.check_sizes`: answered ERROR, dead-lettered),
and the partition goes on after one failed commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from app.errors import KafkaUnavailable
from app.kafka.ports import Admin
from app.kafka.records import RECORD_FRAMING, TOPIC_RECORD_BYTES

__all__ = [
    "LIST_TIMEOUT_MS",
    "NO_TARGET",
    "WRITES_REFUSED_MS",
    "TopicCatalog",
    "no_target_message",
    "refused_message",
    "takes_at_most",
    "topic_limits",
]

logger = logging.getLogger(__name__)

NO_TARGET: Final = "NO_TARGET"
"""The failure code of a send to a command topic the cluster does not have."""

MAX_MESSAGE_BYTES: Final = "max.message.bytes"

WRITES_REFUSED_MS: Final = 60_000
"""How long a topic that refused this node's writes (no Write ACL for its principal) is
taken to refuse them (`refuses`): a decision's command to it is answered ERROR meanwhile,
not written, and written again after, should the ACL have been added since."""

LIST_TIMEOUT_MS: Final = 30_000
"""How long a listing may take before it is given up (failed): the admin client's request
timeout, so that one that never answers cannot hold every miss, and the list, for good."""


def no_target_message(topic: str) -> str:
    """What a command refused for its missing topic is answered with (names the topic)."""
    return (
        f"{NO_TARGET}: topic {topic} does not exist (a typo'd target type, or a context not "
        "deployed yet); nothing was sent, and a retry once it exists goes through"
    )


def refused_message(topic: str, why: str) -> str:
    """What a command to a topic that refused this node's writes is answered with."""
    return (
        f"{NO_TARGET}: topic {topic} refused this node's writes a moment ago ({why}); "
        f"nothing was sent, and one after {WRITES_REFUSED_MS // 1000} s is written again "
        "(add the Write ACL for the node's principal on it)"
    )


def topic_limits(admin: Admin) -> Callable[[list[str]], Awaitable[dict[str, int | None]]]:
    """A catalog's `read_limits` over `admin`: one DescribeConfigs for the topics asked."""

    async def read(topics: list[str]) -> dict[str, int | None]:
        configs = await admin.topic_configs(topics, (MAX_MESSAGE_BYTES,))
        found: dict[str, int | None] = {}
        for topic in topics:
            value = configs.read.get(topic, {}).get(MAX_MESSAGE_BYTES)
            found[topic] = int(value) if value is not None and value.isdigit() else None
        return found

    return read


class TopicCatalog:
    """The cluster's topic names as last listed; `missing` answers from the list at once."""

    def __init__(
        self,
        list_topics: Callable[[], Awaitable[set[str]]],
        now: Callable[[], int],
        *,
        max_age_ms: int = 30_000,
        min_interval_ms: int = 1_000,
        on_missing: Callable[[str], None] | None = None,
        sleep_ms: Callable[[int], Awaitable[None]] | None = None,
        list_timeout_ms: int = LIST_TIMEOUT_MS,
        timer_ms: Callable[[int], Awaitable[None]] | None = None,
        read_limits: Callable[[list[str]], Awaitable[Mapping[str, int | None]]] | None = None,
    ) -> None:
        """`sleep_ms` waits that many ms of `now`'s clock (the interval between listings);
        `timer_ms` times a listing's deadline, `sleep_ms` unless given (a fake sleep that
        moves its clock on at once, for the interval, cannot time a deadline).
        `read_limits`: the `max.message.bytes` of some topics, None for one not read
        (`topic_limits`, over `Admin.topic_configs`); None: `takes` reads none, every topic
        taken to take what one of the broker's defaults does."""
        self._list = list_topics
        self._now = now
        self.max_age_ms = max_age_ms
        self.min_interval_ms = min_interval_ms
        self._on_missing = on_missing
        self._sleep_ms = sleep_ms or _sleep_ms
        self._timer_ms = timer_ms or self._sleep_ms
        self.list_timeout_ms = list_timeout_ms
        self._names: set[str] | None = None
        self._listed_at: int | None = None  # when the last listing began (the node's clock)
        # The listing in flight or last done: why it failed, None when it succeeded.
        self._task: asyncio.Task[str | None] | None = None
        # The listing the misses of `exists` wait for, until it begins (then a new one).
        self._next: asyncio.Task[str | None] | None = None
        self._read_limits = read_limits
        self._in_read: set[str] = set()  # the topics of the reads under way
        # By topic, what it takes of a record and when that was read; the topics asked
        # that the read under way (`_reading`) has not begun with yet.
        self._takes: dict[str, tuple[int, int]] = {}
        self._unread: set[str] = set()
        self._unreadable: set[str] = set()  # warned about once each
        # The node's own topics' limits its checks read (`keep_current`), and which.
        self._kept: dict[str, int] | None = None
        self._kept_topics: frozenset[str] = frozenset()
        # The dead-letter topics' `max.message.bytes` the letters are cut to, by topic.
        self._letters: dict[str, int] | None = None
        # By topic, why and when it last refused this node's writes (`writes_refused`).
        self._refused: dict[str, tuple[str, int]] = {}
        self._reading: asyncio.Task[None] | None = None

    async def refresh(self) -> bool:
        """Lists the topics now (waits for a listing in flight instead of starting one);
        whether that listing succeeded."""
        return await self._listed() is None

    async def _listed(self) -> str | None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._refresh(), name="topic catalog")
        return await asyncio.shield(self._task)

    async def stop(self) -> None:
        for task in (self._next, self._task, self._reading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def known(self, topic: str) -> bool:
        """Whether the last listing had `topic`."""
        return self._names is not None and topic in self._names

    def missing(self, topic: str) -> bool:
        """Whether `topic` is known not to exist: listed, and not in the list. Counted (the
        caller refuses the send). Never listed yet: not known missing (the send is tried).
        A miss, or a list older than `max_age_ms`, starts a listing in the background."""
        if self._names is None:
            self._maybe_refresh(self.min_interval_ms)  # a failing listing: once a second
            return False
        absent = topic not in self._names
        self._maybe_refresh(self.min_interval_ms if absent else self.max_age_ms)
        if absent and self._on_missing is not None:
            self._on_missing(topic)
        return absent

    def writes_refused(self, topics: Iterable[str], why: str) -> None:
        """`topics` (another context's) refused this node's writes (a partition's
        transaction failed so): a decision's command to one is refused for a while
        (`refuses`) rather than written into a transaction it would fail again."""
        at = self._now()
        for topic in topics:
            self._refused[topic] = (why, at)

    def refuses(self, topic: str) -> str | None:
        """Why `topic` refused this node's writes less than `WRITES_REFUSED_MS` ago, or
        None."""
        if (refused := self._refused.get(topic)) is None:
            return None
        if 0 <= self._now() - refused[1] < WRITES_REFUSED_MS:
            return refused[0]
        del self._refused[topic]
        return None

    def takes(self, topic: str) -> int:
        """What `topic` takes of a record, its key and value together, as last read: its
        `max.message.bytes` less a record's framing, at most `TOPIC_RECORD_BYTES` (what a
        topic of the broker's defaults takes: assumed until read). One not read yet, or
        read over `max_age_ms` ago, is read in the background; a read that fails keeps
        what the last one said."""
        known = self._takes.get(topic)
        if self._read_limits is not None and (
            known is None or not 0 <= self._now() - known[1] < self.max_age_ms
        ):
            if topic not in self._in_read:
                self._unread.add(topic)
            if self._reading is None or self._reading.done():
                self._reading = asyncio.create_task(self._read_takes(), name="topic limits")
        return TOPIC_RECORD_BYTES if known is None else known[0]

    async def read_takes(self, topic: str) -> int:
        """What `topic` takes, read now (waited for): before something is done that a
        limit read 30 s ago could have got wrong (a row deleted as too large)."""
        if self._read_limits is not None:
            await self._read([topic])
        return self.takes(topic)

    async def read_again(self, topics: Iterable[str]) -> None:
        """Reads what each of `topics` takes now, in one call (waited for): after the broker
        refused a record or a batch as too large, before what is sized by them is made
        again (a partition's producer, its batches under its topics' limits)."""
        if self._read_limits is not None:
            await self._read(sorted(set(topics)))

    def keep_current(
        self,
        limits: dict[str, int],
        topics: Iterable[str],
        letters: dict[str, int] | None = None,
    ) -> None:
        """Has each read of one of `topics` (the node's own) kept in `limits` (what those
        that take less than a topic of the broker's defaults take: `InputLimits.
        topic_record_bytes`, read at the start), and of a topic in `letters` its
        `max.message.bytes` there (`InputLimits.dead_letter_topic_bytes`), so that every
        check reading them sees a limit lowered, or raised, since; one that cannot be read
        is left as it was."""
        self._kept, self._kept_topics = limits, frozenset(topics)
        self._letters = letters

    async def _read_takes(self) -> None:
        """Reads what each topic asked takes, until none is left unread."""
        while self._unread:
            topics = sorted(self._unread)
            self._unread.clear()
            await self._read(topics)

    async def _read(self, topics: list[str]) -> None:
        """Reads what `topics` take, in one call (`read_limits`, within `list_timeout_ms`)."""
        assert self._read_limits is not None
        at = self._now()
        self._in_read.update(topics)
        try:
            async with asyncio.timeout(self.list_timeout_ms / 1000):
                read: Mapping[str, int | None] = await self._read_limits(topics)
        except Exception as exc:  # whatever it is, the last known stays, read again later
            read = {}
            why = repr(exc)
        else:
            why = "not answered"
        finally:
            self._in_read.difference_update(topics)
        for topic in topics:
            if (limit := read.get(topic)) is None:
                self._unread_limit(topic, at, why)
                continue
            takes = limit - RECORD_FRAMING
            self._takes[topic] = (min(takes, TOPIC_RECORD_BYTES), at)
            if self._letters is not None and topic in self._letters:
                self._letters[topic] = limit
            if self._kept is not None and topic in self._kept_topics:
                if takes < TOPIC_RECORD_BYTES:
                    self._kept[topic] = takes
                else:
                    self._kept.pop(topic, None)

    def _unread_limit(self, topic: str, at: int, why: str) -> None:
        """`topic`'s limit could not be read (no DescribeConfigs ACL on it, the broker
        away): what the last read said stays (the default when none did), until the next."""
        known = self._takes.get(topic)
        self._takes[topic] = (TOPIC_RECORD_BYTES if known is None else known[0], at)
        if topic not in self._unreadable:
            self._unreadable.add(topic)
            logger.warning(
                "cannot read %s's max.message.bytes (%s): a record to it is bounded by what "
                "it was last read to take (until then, what a topic of the broker's "
                "defaults takes)",
                topic,
                why,
            )

    async def exists(self, topic: str) -> bool:
        """Whether `topic` exists: for a caller that may wait (a timer's send). A miss is
        answered by a listing begun after it (at most one per `min_interval_ms`, waited
        for), so a topic created since the last listing is found, not refused.
        `KafkaUnavailable` when that listing failed: whether it exists is not known."""
        if not self.known(topic):
            if self._next is None:
                self._next = asyncio.create_task(self._list_next(), name="topic catalog (miss)")
            failure = await asyncio.shield(self._next)
            if failure is not None:
                raise KafkaUnavailable(
                    f"cannot tell whether topic {topic} exists: {failure} (nothing was sent; "
                    "a retry lists again)"
                )
        return not self.missing(topic)

    async def _list_next(self) -> str | None:
        """A listing begun after the one in flight, if any, and `min_interval_ms` after the
        last one began; the misses asking until it begins all wait for it."""
        try:
            running = self._task
            if running is not None and not running.done():
                await asyncio.wait([running])  # one listing at a time (it began before)
            if self._listed_at is not None:
                # At most the interval: a clock stepped back (NTP) since the last listing
                # would make it the step's length, an hour for an hour.
                wait = min(
                    self._listed_at + self.min_interval_ms - self._now(), self.min_interval_ms
                )
                if wait > 0:
                    await self._sleep_ms(wait)
        finally:
            self._next = None  # from here a miss needs the listing after this one
        return await self._listed()

    def _stale(self, age_ms: int) -> bool:
        if self._listed_at is None:
            return True
        age = self._now() - self._listed_at
        return age >= age_ms or age < 0  # < 0: the clock stepped back since it listed

    def _maybe_refresh(self, age_ms: int) -> None:
        if self._stale(age_ms) and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._refresh(), name="topic catalog")

    async def _refresh(self) -> str | None:
        """Lists the topics; why the listing failed, None when it succeeded."""
        self._listed_at = self._now()
        try:
            self._names = await self._listing()
        except Exception as exc:
            # The list stays as it was: the next miss or stale read tries again.
            logger.warning("listing the topics failed: %r", exc)
            return f"listing the cluster's topics failed: {exc}"
        return None

    async def _listing(self) -> set[str]:
        """The listing's answer, or `KafkaUnavailable` once `list_timeout_ms` passed on the
        catalog's clock (the listing is cancelled and left: one that ignores it cannot hold
        the catalog)."""
        listing = asyncio.ensure_future(self._list())
        deadline = asyncio.ensure_future(self._timer_ms(self.list_timeout_ms))
        try:
            await asyncio.wait({listing, deadline}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listing, deadline):
                task.cancel()  # when not done
                task.add_done_callback(_retrieved)
        if not listing.done():
            raise KafkaUnavailable(f"listing the topics took over {self.list_timeout_ms} ms")
        return set(listing.result())


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Reads a given-up listing's (or deadline's) end, so that a late failure is not
    reported unretrieved."""
    if not task.cancelled():
        task.exception()


async def _sleep_ms(ms: int) -> None:
    await asyncio.sleep(ms / 1000)


def takes_at_most(topic: str, limits: Mapping[str, int], catalog: TopicCatalog | None) -> int:
    """What `topic` takes of a record at most: the least of what `limits` say (read at the
    node's start, `InputLimits.topic_record_bytes`; a topic not in them takes what one of
    the broker's defaults does) and what `catalog` last read (`TopicCatalog.takes`)."""
    takes = limits.get(topic, TOPIC_RECORD_BYTES)
    return takes if catalog is None else min(takes, catalog.takes(topic))
