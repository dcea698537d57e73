"""`Sends`: the runner's remote sends, each in a task of its own, never outliving its claim
nor leaving once its row changed (a cancel, a pause or a reschedule carried out while its
claim was committed); each outcome kept in its partition's `PartitionFiring` for the next
write, and `answered` set so that the loop writes it without waiting for its next round."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from app.timers.runner.decision_types import NOTHING, Decision
from app.timers.runner.decisions import (
    NOT_CLAIMED,
    TIMEOUT,
    TRANSPORT_ERROR,
    WITHDRAWN,
    SendResult,
    release,
)
from app.timers.runner.options import TimerOptions
from app.timers.runner.partition import PartitionFiring
from app.timers.runner.partition_store import store_of
from app.timers.runner.ports import CheckingSender, Clock, FiringStore, Sender
from app.timers.runner.stats import RoundStats
from tables.exceptions import StoreClosed, StoreError
from tables.timer import Timer

__all__ = ["Sends"]

logger = logging.getLogger(__name__)


class Sends:
    """At most `max_in_flight` sends at once (a gate, not a lock: sends run side by side).
    A partition's rounds claim no more than its share of it (`TimerRunner.share`), so
    the gate bounds the total and never holds one partition's sends behind another's
    while the shares add up to no more than it (as many partitions as sends, at most)."""

    def __init__(
        self, store: FiringStore, sender: Sender, clock: Clock, options: TimerOptions
    ) -> None:
        self._store = store
        self._sender = sender
        # Asked once: a runtime Protocol check walks its members on every call.
        self._checking = sender if isinstance(sender, CheckingSender) else None
        self._clock = clock
        self._options = options
        self._gate = asyncio.Semaphore(options.max_in_flight)
        self.answered = asyncio.Event()
        """Set when a send's outcome is in (to be written): the loop waits on it too (a
        partition's own loop on its firing's `answered`)."""

    def spawn(
        self, firing: PartitionFiring, claimed: Timer, stats: RoundStats
    ) -> asyncio.Task[Decision]:
        began = asyncio.Event()
        task = asyncio.create_task(
            self._send_one(firing, claimed, stats, began), name=f"send {claimed.request_id}"
        )
        firing.in_flight.add(task)
        firing.sending.add(claimed.id)
        task.add_done_callback(firing.in_flight.discard)
        task.add_done_callback(lambda _: firing.sending.discard(claimed.id))
        task.add_done_callback(lambda done: self._sent(firing, claimed, done, began))
        return task

    def _sent(
        self,
        firing: PartitionFiring,
        claimed: Timer,
        task: asyncio.Task[Decision],
        began: asyncio.Event,
    ) -> None:
        try:
            if task.cancelled():
                if not began.is_set():
                    # Cut short before its first turn (a stop right after its round): its
                    # own handler never ran. Given back all the same, as below, so that the
                    # next owner need not wait for the claim to lapse (a take-over of the
                    # claims left misses one whose deadline, on a clock ahead, is past its
                    # horizon). Run before the cut's own wait returns: its callback comes
                    # after these.
                    firing.outcomes.append(release(claimed))
            elif (exc := task.exception()) is not None:
                # No outcome: its claim lapses and it is sent again, by this node or the next.
                logger.error("deciding the outcome of %s failed", task.get_name(), exc_info=exc)
        except Exception:
            # Not given back: its claim lapses. Whoever waits for an answer is told all the
            # same (a stop waiting on it would otherwise wait for ever).
            logger.exception("giving back the claim of %s failed", task.get_name())
        finally:
            self.answered.set()
            firing.answered.set()

    async def _send_one(
        self, firing: PartitionFiring, claimed: Timer, stats: RoundStats, began: asyncio.Event
    ) -> Decision:
        began.set()
        send: asyncio.Future[SendResult] | None = None
        try:
            async with self._gate:
                now = self._clock.now()
                # The send must end inside the claim, or another owner could send it too.
                deadline = min(now + self._options.send_timeout, claimed.due_at)
                if deadline <= now:
                    decision = release(claimed)
                else:
                    send = asyncio.ensure_future(self._send_if_claimed(firing, claimed, stats))
                    result = await self._until(claimed, send, deadline)
                    decision = self._decide(firing, claimed, result)
        except asyncio.CancelledError:
            # Cut short by a hand-off: a result already in is written all the same; without
            # one, the claim is given back so that the next owner need not wait for it.
            if send is not None and send.done() and not send.cancelled():
                decision = self._decide(firing, claimed, _result_of(claimed, send))
            else:
                decision = release(claimed)
            firing.outcomes.append(decision)
            raise
        firing.outcomes.append(decision)
        return decision

    def _decide(self, firing: PartitionFiring, claimed: Timer, result: SendResult) -> Decision:
        if result.code == WITHDRAWN:
            return NOTHING  # the row holds what came since: left as it is
        return firing.decide(claimed, result, self._clock.now(), self._options)

    async def _send_if_claimed(
        self, firing: PartitionFiring, claimed: Timer, stats: RoundStats
    ) -> SendResult:
        """The send of `claimed` if its row is still as claimed, `WITHDRAWN` otherwise.

        A cycle may carry out a cancel, a pause or a reschedule of the timer while its
        claim's commit is in flight (it holds the partition's lock, the commit does not):
        the row is then written over, and the command must not leave after it. Looked at
        in the step that hands the record over (a store's find does not suspend here; a
        `CheckingSender` asks after its own waits, a topic listing), so that no cycle runs
        between the look and the hand-over. Left open: a wait inside the producer's own
        send (its first metadata of a topic, room in its buffer under a burst), and a
        change carried out after the hand-over, one after the fire, whose outcome write
        the row then refuses."""

        async def still() -> bool:
            try:
                row = await store_of((firing,), self._store).find(claimed.owner, claimed.key)
            except StoreClosed:
                return False  # let go: the claim is the next owner's to send
            except StoreError as exc:
                firing.fail(exc)  # a corrupt row: its partition is restored, never sent
                return False
            if row is None or not row.same_as_loaded(claimed):
                return False
            stats.sent += 1
            return True

        if self._checking is not None:
            return await self._checking.send_if(claimed, still)
        if not await still():
            return NOT_CLAIMED
        return await self._sender.send(claimed)

    async def _until(
        self, claimed: Timer, send: asyncio.Future[SendResult], deadline: int
    ) -> SendResult:
        """The send's result by `deadline` on the runner's clock, else TIMEOUT."""
        expiry = asyncio.ensure_future(self._clock.sleep_until(deadline))
        try:
            racing: set[asyncio.Future[Any]] = {send, expiry}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            expiry.cancel()
            if not send.done():
                send.cancel()
                # Waited for, so that no send outlives its claim; `wait` raises nothing of it.
                await asyncio.wait({send})
        if send.cancelled():
            return SendResult(TIMEOUT, f"no result within {self._options.send_timeout} ms")
        return _result_of(claimed, send)


def _result_of(claimed: Timer, send: asyncio.Future[SendResult]) -> SendResult:
    """A finished send's result; an exception is a technical failure (no transport)."""
    exc = send.exception()
    if exc is not None:
        logger.warning("send of %s failed: %r", claimed.request_id, exc)
        return SendResult(TRANSPORT_ERROR, repr(exc))
    return send.result()
