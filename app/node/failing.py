"""Partitions whose work failed, and which of them fire nothing until their log is read.

A failure of the node's own (`app.errors.node_fault`) ends a partition's work; it is taken
afresh. Where the failed cycle was reading records, the partition is *held* once taken
again: its timers fire only after a cycle has read past the offsets the failed one read
from, so that no timer fires past a cancel its log holds but the node has not seen. A
partition failing again at the same offsets counts up, and `/healthz` says where and why.
Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from app.backoff import capped_backoff
from app.kafka.records import refused, refused_topics

__all__ = [
    "A_COMMIT",
    "A_CYCLE",
    "BEHIND",
    "ITS_WORKER",
    "RETAKE_BACKOFF_MAX_S",
    "RETAKE_BACKOFF_S",
    "Failing",
    "FailingPartitions",
    "refused_for_good",
    "retake_after",
]

A_CYCLE = "a cycle"
ITS_WORKER = "its worker"
A_COMMIT = "a commit"
"""What failed, where a partition's work names it (`FailingPartitions.failed`)."""
BEHIND = "its log, read from behind its end"
"""No failure: p was taken with its log to read up to where it ended then (`behind`)."""

_PASSED_BY_A_CYCLE = frozenset({A_CYCLE, ITS_WORKER})

RETAKE_BACKOFF_S = 0.5
RETAKE_BACKOFF_MAX_S = 10.0
"""A partition failing again and again where it failed before waits before each retake:
none after its first failure, then `RETAKE_BACKOFF_S` doubling up to this (`retake_after`),
so that a fault that never passes costs a restore every 10 s, not four a second."""


def retake_after(failing: Failing) -> float:
    """How long a partition whose work failed waits before it is taken afresh (unless the
    group answers first): at once the first time, then longer each time in a row."""
    if failing.failures <= 1:
        return 0.0
    # Capped, not raised: a fault of hours counts a thousand failures (2 ** 1098 overflowed).
    return capped_backoff(RETAKE_BACKOFF_S, RETAKE_BACKOFF_MAX_S, failing.failures - 2)


@dataclass(frozen=True, slots=True)
class Failing:
    """A partition's last failure: how far its cycle was reading (the last offset of each
    topic; empty: no records), why, and how many failures in a row were at those offsets."""

    at: dict[str, int]
    error: str
    failures: int
    what: str = A_CYCLE

    def describe(self) -> str:
        where = ", ".join(f"{topic}@{offset}" for topic, offset in sorted(self.at.items()))
        if self.what == BEHIND and not self.failures:
            return f"was taken behind its log's end, at {where}"
        times = "once" if self.failures == 1 else f"{self.failures} times in a row"
        return f"failed {times}{' at ' + where if where else ''}: {self.error}"


class FailingPartitions:
    def __init__(self) -> None:
        self._failing: dict[int, Failing] = {}
        self._held: set[int] = set()
        # A hold released by a cycle's staging (`read`), until the commit that carries that
        # cycle lands (`committed`): the failure it passed, and that commit's number.
        self._passed: dict[int, tuple[Failing, int]] = {}

    def failed(self, p: int, at: dict[str, int], error: str, what: str = A_CYCLE) -> Failing:
        """p's work (`what`) failed while its cycle read up to `at` (the last offset of
        each topic); p is held when it read records. A failure while held keeps every
        offset it was held at (a commit's failure reads nothing, a retry may read less):
        the hold is released only past all of them. A failure reading no records counts
        as again while the last one (of whatever work) is not forgotten (`worked`). A
        failure before the commit of the cycle that released p's hold landed (`read`)
        holds p again where it was held: that cycle never counted, and p is read again
        from its committed offsets."""
        if (passed := self._passed.pop(p, None)) is not None and p not in self._failing:
            self._failing[p] = passed[0]
            self._held.add(p)
        before = self._failing.get(p)
        if before is not None and p in self._held:
            at = _furthest(at, before.at)
        again = before is not None and before.at == at
        failing = Failing(dict(at), error, before.failures + 1 if again and before else 1, what)
        self._failing[p] = failing
        if at:
            self._held.add(p)
        return failing

    def worked(self, p: int, what: str) -> None:
        """p's `what` worked (a commit landed, a timer round passed): a failure of it that
        read no records is forgotten. Not a cycle's staging: a commit refused for good
        fails after every cycle, and would otherwise never count up."""
        failing = self._failing.get(p)
        if failing is not None and not failing.at and failing.what == what:
            del self._failing[p]

    def held(self, p: int) -> bool:
        """Whether p's timers wait for its log to be read past where it failed."""
        return p in self._held

    def behind(self, p: int, at: dict[str, int]) -> None:
        """p was taken to read its log from before `at` (the last record of each topic when
        it was taken): it fires nothing until a cycle has read past them, as after a
        failure. A timer set in that part of the log and cancelled later in it must not
        fire in between (a rebuild's replay from the log's start, a node far behind).
        Counts no failure."""
        if not at:
            return
        before = self._failing.get(p)
        if before is None:
            self._failing[p] = Failing(dict(at), "taken behind its log's end", 0, BEHIND)
        else:
            merged = _furthest(at, before.at)
            self._failing[p] = Failing(merged, before.error, before.failures, before.what)
        self._held.add(p)

    def rewound(self, p: int, starts: dict[str, int]) -> None:
        """p's take reads each topic again from `starts` (the group's committed offsets).
        What its hold waits for below them was read and committed (a cycle that wrote
        nothing commits its offsets outside any transaction, so no landed commit of its own
        says so): no cycle reads it again, and it is not waited for; the hold ends once
        nothing is left of it."""
        failing = self._failing.get(p)
        if failing is None or p not in self._held:
            return
        left = {t: o for t, o in failing.at.items() if not (t in starts and o < starts[t])}
        if left == failing.at:
            return
        if left:
            self._failing[p] = Failing(left, failing.error, failing.failures, failing.what)
        else:
            del self._failing[p]
            self._held.discard(p)

    def committed(self, p: int, landed: int) -> None:
        """p's `landed`-th commit landed: a hold released by a cycle it carries is gone."""
        if (passed := self._passed.get(p)) is not None and landed >= passed[1]:
            del self._passed[p]

    def read(self, p: int, done: dict[str, int], carried_by: int = 0) -> bool:
        """A cycle of p staged, the last offsets done per topic as given, to be carried
        by p's `carried_by`-th commit; whether that releases p's hold (it read past every
        offset the failed cycle read). Released until that commit lands (`committed`)."""
        failing = self._failing.get(p)
        if failing is None:
            return False
        if not failing.at and failing.what not in _PASSED_BY_A_CYCLE:
            return False  # a commit's, a round's: passed when it works (`worked`)
        if any(done.get(topic, -1) < offset for topic, offset in failing.at.items()):
            return False
        del self._failing[p]
        if p in self._held:
            self._held.discard(p)
            self._passed[p] = (failing, carried_by)
            return True
        return False

    def again_and_again(self, times: int) -> bool:
        """Whether a partition failed at least `times` in a row at the same offsets."""
        return any(f.failures >= times for f in self._failing.values())

    def forget(self, p: int) -> None:
        """p was let go for good (revoked): a next owner starts with a clean slate."""
        self._failing.pop(p, None)
        self._held.discard(p)
        self._passed.pop(p, None)

    def stalled(self) -> dict[int, str]:
        """Why each held partition fires nothing, for `/healthz`."""
        return {
            p: f"fires nothing until its log is read past where it {self._failing[p].describe()}"
            for p in sorted(self._held)
            if p in self._failing
        }

    def report(self) -> dict[str, dict[str, object]]:
        """Every partition's last failure not yet read past: where, why, how many times."""
        return {
            str(p): {"at": f.at, "error": f.error, "failures": f.failures, "held": p in self._held}
            for p, f in sorted(self._failing.items())
        }


def _furthest(at: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """The offsets of both holds, the further of the two where both name a topic."""
    return {t: max(o, before.get(t, -1)) for t, o in at.items()} | {
        t: o for t, o in before.items() if t not in at
    }


def refused_elsewhere(exc: BaseException, own_topics: Collection[str]) -> frozenset[str]:
    """The topics other than the node's `own_topics` a partition's failure `exc` names
    refused (another context's commands topic this principal may not write); none when
    it is no topic refusal or names none."""
    topics = refused_topics(exc) if refused(exc) else None
    return frozenset() if topics is None else topics.difference(own_topics)


def refused_for_good(exc: BaseException, own_topics: Collection[str]) -> bool:
    """Whether a partition's failure `exc` is a refusal that its every retake, on any node
    of the group, meets again: this principal refused its group, its transactional id, the
    cluster, its login, or one of the node's `own_topics` (an ACL taken away mid-run). The
    node stops then. Any other topic refused (another service's commands, say), or one
    the client does not name (librdkafka's), fails the partition alone, which backs off."""
    if not refused(exc):
        return False
    topics = refused_topics(exc)
    return topics is None or not topics.isdisjoint(own_topics)
