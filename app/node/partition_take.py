"""Taking a partition of one type, as its task's take runs in the background
(`take_partition`): after the closes of an earlier task of it, and after a failure its own
close first, then its state restored and its transaction opened (`open_partition`), its
topics rewound to the group's committed offsets, and its timers held until its log is
read to where it ended now. Tried `TAKE_ATTEMPTS` times; a partition that cannot be taken
stops the node (loudly), never a take that dies quietly, half done. A take failed by the
cluster's own state (`take_failure`: too few in-sync replicas, no producer id given)
counts no attempt and is tried again for up to `CLUSTER_WAIT_MAX_S`, the partition not
ready meanwhile: stopped at once, the node would hand the partition to another, which
meets the same state; past it, the state may be this node's alone (`take_retry`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Literal

from app.backoff import capped_backoff
from app.errors import KafkaUnavailable, node_fault
from app.kafka.records import causes, refused, short_of_replicas
from app.node.failing import RETAKE_BACKOFF_MAX_S
from app.node.opening import written_topics
from app.node.partition_open import last_records
from app.node.type_transactions import NoProducerId
from app.task_ends import cancelled_here

if TYPE_CHECKING:
    from app.node.partition_task import PartitionTask

__all__ = [
    "CLUSTER_WAIT_MAX_S",
    "TAKE_ATTEMPTS",
    "TakeFailure",
    "take_failure",
    "take_partition",
    "take_retry",
]

logger = logging.getLogger(__name__)

TAKE_ATTEMPTS = 10
"""A partition not taken in this many attempts stops the node (loudly)."""

TAKE_BACKOFF_S = 0.2
"""The wait before a take's second attempt, doubling at each next one (`take_retry`)."""

TAKE_BACKOFF_MAX_S = 5.0
"""The longest wait between two counted attempts of a take."""

CLUSTER_WAIT_MAX_S = 600.0
"""A take failed by the cluster's state for this long in a row stops the node (loudly), as
counted failures do: the state may be this node's alone (a broker it cannot reach, holding
its transactional ids' coordinator), and stopped, it lets the group give the partition to
a node that can take it; never a partition left waiting for good while the rest runs."""

TakeFailure = Literal["final", "cluster", "counted"]
"""How a take's attempt failed (`take_failure`): for good (an operator must act), by the
cluster's state (waited out, not counted), or otherwise (counted)."""


async def take_partition(
    task: PartitionTask,
    topics: set[str],
    after_failure: float | None,
    behind: Collection[asyncio.Task[bool]],
) -> None:
    """Takes `task`'s p, then runs it. `after_failure`: its work stopped on a failure: it
    is closed first (nothing of its local copy is trusted), and taken again once the group
    answers (its next assignment) or after that many seconds, if the group gives it to
    this node then. A partition that cannot be taken stops the node."""
    manager = task.manager
    try:
        if behind:
            await asyncio.wait(behind)  # never cancels them (a stop_taking cancels this)
            if not all(not close.cancelled() and close.result() for close in behind):
                # p may be half open there (a close that crashed failed the node): its
                # transactional id is not opened again, nothing of p is taken.
                logger.error("%s: its previous task's close failed: not taken", task.key)
                if any(close.cancelled() for close in behind):
                    manager.fail(f"{task.key}: a close of it was cancelled")
                return
        await _taking(task, topics, after_failure)
    except (Exception, asyncio.CancelledError) as exc:
        cancelled = isinstance(exc, asyncio.CancelledError)
        if cancelled and cancelled_here():
            raise  # its stop_taking (or the node's stop)
        # A bug, whatever it is, or a CancelledError leaked out of a call (a client's),
        # not a cancel of this take: never a partition left half taken, quietly.
        logger.exception("taking %s failed", task.key)
        manager.fail(f"taking {task.key} failed: {exc!r}")


async def _taking(task: PartitionTask, topics: set[str], after_failure: float | None) -> None:
    p, manager, consumer = task.p, task.manager, task.shared.consumer
    if after_failure is not None:
        answered = manager.answered()
        await task.close(clean=False)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(after_failure):
                await answered.wait()
        # As the group gives it now (a lost membership empties the assignment the
        # failure saw; the next one may give p back).
        topics = {t for t, _ in task.given()}
        if not topics:
            manager.task_gone(task)  # the group moved it meanwhile
            return
        consumer.pause([(t, p) for t in topics])
        if task.limits_doubtful:
            # Refused as too large: a topic's limit lowered since it was read (within
            # `TopicCatalog.max_age_ms`). Read now, its producer opened next batches under
            # it, and its records are checked by it; at once, not a failed take per read.
            kept = task.kept
            await task.shared.targets.read_again([*written_topics(kept.topics), *kept.batch_topics])
            task.limits_doubtful = False
        task.revive()
    # Counted attempts failed, and failures by the cluster's state since the last of them.
    # A wait for the cluster gives no attempt back: failing by turns (a broker flapping),
    # each kind resetting the other's count, the take would never end.
    attempts = waited = 0
    waiting_since: float | None = None  # the first of the cluster's failures in a row
    while True:
        try:
            lost = await task.open_topics(topics)
            rewound = await consumer.rewind([(t, p) for t in topics])
            starts = {t: offset for (t, q), offset in rewound.items() if q == p}
            if missing := topics - set(starts):
                raise _Unassigned(f"{', '.join(sorted(missing))} not assigned when rewound")
            if lost is not None:
                await _replayed(task, starts, lost)
            task.failing.rewound(p, starts)  # a hold below them was read and committed
            # Its timers fire once its log is read to where it ended now.
            events = task.kept.topics.events
            tail = {events: starts[events]} if events in starts else {}
            task.failing.behind(p, await last_records(task.shared.reader, p, tail))
            break
        except _Unassigned as exc:
            topics = await _unassigned(task, exc)
            if not topics:
                return
            continue
        except Exception as exc:
            last: BaseException = exc
            if isinstance(exc, KafkaUnavailable) and not _final(exc):
                last = await _refusal(task) or exc
            failure = take_failure(last)
            now = time.monotonic()
            if failure == "cluster":
                waited += 1
                waiting_since = now if waiting_since is None else waiting_since
            elif failure == "counted":
                attempts, waited, waiting_since = attempts + 1, 0, None
            waited_s = 0.0 if waiting_since is None else now - waiting_since
            delay = take_retry(failure, attempts, waited, waited_s)
            if delay is None:
                if failure == "final":
                    manager.fail(f"{task.key} could not be taken: {last}")
                elif failure == "cluster":
                    manager.fail(
                        f"{task.key} could not be taken for {waited_s:.0f} s, the cluster "
                        f"refusing it at each of {waited} attempts (is a broker out of this "
                        f"node's reach, or short of in-sync replicas?): {last}"
                    )
                else:
                    manager.fail(
                        f"{task.key} could not be taken in {TAKE_ATTEMPTS} attempts: {last}"
                    )
                return
            if failure == "cluster":
                # Not ready meanwhile (it is being taken), and /healthz says why.
                task.broken = f"waiting for the cluster to let it be taken: {exc}"
                logger.warning(
                    "taking %s waits for the cluster (not counted; again in %.1f s): %s",
                    task.key,
                    delay,
                    exc,
                )
            else:
                task.broken = None  # no longer waiting for the cluster, if it was
                # A node fault is expected to pass; anything else is a bug to see, but
                # either way p is tried again, and the node stops loudly if it never can
                # be taken.
                log = logger.warning if node_fault(exc) else logger.exception
                log("taking %s failed (%d/%d): %s", task.key, attempts, TAKE_ATTEMPTS, exc)
            await task.close(clean=False)
            task.revive()
            await asyncio.sleep(delay)
    task.run(topics)


def take_failure(exc: BaseException) -> TakeFailure:
    """How a take's attempt that raised `exc` failed: "final" when no retake passes it
    (`_final`); "cluster" when the cluster's own state refused it, which passes by itself
    once its replicas are back: a write short of in-sync replicas, or no producer id given
    in time (the coordinator holds it behind the abort markers of the previous owner's
    transaction, which it cannot write then; the node cannot see the replicas itself);
    "counted" otherwise (anything else, a bug included)."""
    if _final(exc):
        return "final"
    if short_of_replicas(exc) or any(isinstance(c, NoProducerId) for c in causes(exc)):
        return "cluster"
    return "counted"


def take_retry(
    failure: TakeFailure, attempts: int, waited: int, waited_s: float = 0.0
) -> float | None:
    """How long a take waits before its next attempt after one that failed so (`failure`),
    `attempts` counted ones having failed and `waited` by the cluster's state since the
    last of them (this one included), the first of those `waited_s` ago; None: it is given
    up and the node stops. A failure by the cluster's state counts no attempt: its waits
    double up to the retake's longest (`RETAKE_BACKOFF_MAX_S`), one attempt every 10 s
    while it lasts, up to `CLUSTER_WAIT_MAX_S`."""
    if failure == "final":
        return None
    if failure == "cluster":
        if waited_s >= CLUSTER_WAIT_MAX_S:
            return None
        return capped_backoff(TAKE_BACKOFF_S, RETAKE_BACKOFF_MAX_S, max(waited, 1))
    if attempts >= TAKE_ATTEMPTS:
        return None
    return capped_backoff(TAKE_BACKOFF_S, TAKE_BACKOFF_MAX_S, max(attempts, 1))


def _final(exc: BaseException) -> bool:
    """Whether no retake passes `exc`: an ACL or the credentials (`refused`), the cluster
    refusing this node's connections (`_refusal`), or a lost changelog; an operator must
    act."""
    return refused(exc) or isinstance(exc, ChangelogLost | _Refused)


class _Refused(KafkaUnavailable):
    """The cluster lets this node's clients in no more."""


async def _refusal(task: PartitionTask) -> _Refused | None:
    """Why the cluster lets this node's clients in no more (credentials rotated, its
    certificate expired or no longer trusted), or None. aiokafka's clients say only
    "Unable to bootstrap" when a new connection's login or TLS handshake is refused, so a
    take would be tried again and again, then fail naming neither."""
    try:
        await task.shared.check_access()
    except KafkaUnavailable as exc:
        refusal = _Refused(f"the cluster refuses this node's connections: {exc}")
        refusal.__cause__ = exc
        return refusal
    except Exception:  # the client library's own (a SCRAM exchange's ValueError): no answer
        logger.exception("%s: asking the cluster whether it lets this node in failed", task.key)
    return None


class _Unassigned(Exception):
    """A take's rewind found some of p's topics not assigned to this node."""


async def _unassigned(task: PartitionTask, exc: _Unassigned) -> set[str]:
    """A take whose rewind missed some of p's topics (`exc`): the group holds them back (a
    lost membership, whose revoke named none of p, before the group assigns again) or took
    them meanwhile. Run so, p would fire with no hold, its log unread: its reading would
    start over from the committed offsets once given back. p is closed; taken again at
    once if the group gives it here now (it assigned again meanwhile); else the task is
    gone, and the group's next assignment takes p afresh, if it gives p here. The topics
    given now (none: gone)."""
    logger.info("%s: %s; let go, taken afresh as the group gives it", task.key, exc)
    await task.close(clean=False)
    topics = {t for t, _ in task.given()}
    if not topics:
        task.manager.task_gone(task)
        return topics
    task.shared.consumer.pause([(t, task.p) for t in topics])
    task.revive()
    return topics


class ChangelogLost(Exception):
    """The timer changelog of a partition lost rows and nothing will make them again: no
    retake passes it, an operator must rebuild."""


async def _replayed(task: PartitionTask, starts: dict[str, int], lost: str) -> None:
    """Passes when the subscription reads p's log from its start (a rebuild's replay, the
    changelog emptied on purpose), which makes the lost rows again; else `ChangelogLost`.
    Restored from what is left, the table would be missing timers for good, its node
    ready all the same. The loss is noted in the node's data directory (`CleanMarks.lost`)
    until such a replay: the copy is restored from the remains at the first take, and no
    later take of this node may run without the rows either."""
    events = task.kept.topics.events
    if events not in starts:
        return
    first, _ = await task.shared.reader.offsets(events, task.p)
    if starts[events] <= first:
        logger.info(
            "%s: %s; the log is read from its start, which writes them again", task.key, lost
        )
        task.kept.marks.clear_lost(task.p)
        return
    raise ChangelogLost(
        f"{lost}: rows it held are gone (the topic was deleted and made again, or cut by "
        f"an unclean leader election) and the log is read on from offset {starts[events]}, "
        "past the events that made them. Stop every worker and rebuild the timer table "
        "from the log (`tickwheel rebuild`, docs/operations.md)"
    )
