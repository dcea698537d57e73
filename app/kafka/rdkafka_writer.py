"""`TransactionalWriter` over librdkafka (confluent-kafka, the `confluent` extra): a
partition's transaction encoded and sent by C, where aiokafka's costs Python work a record.

librdkafka's transactional calls block, and a record's delivery report is served by the
`flush` that waits for it: every call of a writer runs on the writer's own thread, one at
a time and in order, so the event loop never waits on the broker and a `stop` comes after
whatever the writer was doing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from app.errors import Fenced, KafkaUnavailable
from app.kafka.call_thread import CallThread
from app.kafka.connection import Connectable
from app.kafka.producers import TRANSACTION_BATCH_BYTES, TRANSACTION_REQUEST_BYTES
from app.kafka.rdkafka_config import FENCED_CODES, group_metadata, rdkafka_options
from app.kafka.rdkafka_delivery import produce_all
from app.kafka.rdkafka_errors import aiokafka_cause, error_of, said
from app.kafka.records import (
    TRANSACTION_TIMEOUT_MS,
    OutRecord,
    TxnWork,
    principal_of,
)

__all__ = ["RdkafkaTransactionalWriter"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RdkafkaTransactionalWriter:
    """A producer whose records and consumer offsets commit together, or not at all, on
    librdkafka: the same contract as `TransactionalProducer` (start fences the previous
    writer of the id; any failure breaks it for good, `Fenced` when a newer writer
    started; an open transaction is aborted on any failure but a fence)."""

    def __init__(
        self,
        bootstrap: Connectable,
        transactional_id: str,
        *,
        max_batch_bytes: int = TRANSACTION_BATCH_BYTES,
        timeout: float = 30.0,
        deadline: float | None = None,
    ) -> None:
        """`timeout`: what each of librdkafka's calls may take. `deadline`: what a whole
        call of the writer may take (5 timeouts by default: a commit's flush, offsets,
        commit and abort), after which it is broken whatever librdkafka still does."""
        self.transactional_id = transactional_id
        self._timeout = timeout
        self._deadline = 5 * timeout if deadline is None else deadline
        self._config: dict[str, Any] = {
            **rdkafka_options(bootstrap),
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            # At most the transaction's timeout (librdkafka checks); a commit waits this
            # long at most for its records.
            "message.timeout.ms": int(timeout * 1000),
            # A dead letter holds a whole record of its context's topics (4 MiB topic).
            "message.max.bytes": TRANSACTION_REQUEST_BYTES,
            # Under the topics' `max.message.bytes` (`producers.transaction_batch_bytes`);
            # a larger single record goes alone, as with aiokafka.
            "batch.size": max_batch_bytes,
            "retry.backoff.ms": 10,
            # Java's and aiokafka's partitioner: a keyed record lands where theirs would.
            "partitioner": "murmur2_random",
            "logger": _LOG,
            "error_cb": self._said,
        }
        self._thread = CallThread(f"rdkafka-{transactional_id}")
        self._producer: Producer | None = None
        self._lock = asyncio.Lock()
        self._open = False
        self._stopped = False
        self.broken: KafkaUnavailable | None = None
        # What the open transaction did, for a refusal's message (`_explained`).
        self._principal = principal_of(bootstrap)
        self._work = TxnWork(self.transactional_id)

    async def start(self) -> None:
        """Registers the transactional id (`init_transactions`), fencing its previous
        writer, whose open transaction the broker aborts."""
        try:
            await self._run(self._start)
        except (KafkaException, KafkaUnavailable) as exc:
            raise KafkaUnavailable(
                f"{self.transactional_id} cannot connect: {self._explained(exc)}"
            ) from aiokafka_cause(exc)

    async def stop(self) -> None:
        """Aborts an open transaction (unless broken) and closes the producer; never
        raises. Runs after the writer's last call, on its thread."""
        if self._stopped:
            return
        self._stopped = True
        try:
            await self._run(self._close)
        except Exception as exc:
            logger.warning("%s: stop failed: %r", self.transactional_id, exc)
        finally:
            self._thread.shutdown()

    async def commit(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        """Sends `records` and commits `offsets` for `group_id` in one transaction; the
        records' offsets. `Fenced` when a newer owner took over; any other failure aborts
        the transaction and raises `KafkaUnavailable`."""
        async with self._lock:
            self._check()
            try:
                return await self._run(self._transaction, records, offsets, group_id)
            except BaseException as exc:
                raise self._fail(exc)  # noqa: B904 (its cause is set by _fail)

    async def send(self, records: Sequence[OutRecord]) -> list[int]:
        """Sends `records` into the open transaction (begun if none is) and waits for the
        broker to have them; their offsets. The commit comes with the next `commit`."""
        async with self._lock:
            self._check()
            try:
                return await self._run(self._append, records)
            except BaseException as exc:
                raise self._fail(exc)  # noqa: B904 (its cause is set by _fail)

    @property
    def pending(self) -> bool:
        """Whether records wait in an open transaction."""
        return self._open

    # On the writer's thread.

    def _start(self) -> None:
        self._producer = Producer(self._config)
        self._producer.init_transactions(self._timeout)

    def _close(self) -> None:
        p, self._producer = self._producer, None
        if p is None:
            return
        try:
            if self._open and self.broken is None:
                p.abort_transaction(self._timeout)
        except Exception as exc:
            logger.warning("%s: abort at stop failed: %s", self.transactional_id, said(exc))
        finally:
            self._open = False
            # `close` flushes with no deadline: whatever is left is dropped first (a
            # broken writer's records, never committed), so a stop cannot hang on them.
            # Closed here, not wherever the last reference goes (it joins threads).
            for step in (p.purge, p.close):
                try:
                    step()
                except Exception as exc:
                    # a broken writer's fatal error (its fence) is raised again by the
                    # close that destroys it (the producer is gone all the same)
                    level = logging.DEBUG if self.broken is not None else logging.WARNING
                    logger.log(level, "%s: close: %s", self.transactional_id, said(exc))

    def _transaction(
        self,
        records: Sequence[OutRecord],
        offsets: dict[tuple[str, int], int],
        group_id: str,
    ) -> list[int]:
        p = self._ready()
        try:
            placed = self._append(records)
            self._still_wanted()
            if offsets:
                self._work.committing(group_id, offsets.keys())
                p.send_offsets_to_transaction(
                    [TopicPartition(t, part, o) for (t, part), o in offsets.items()],
                    group_metadata(group_id),
                    self._timeout,
                )
                self._work.offsets_sent()
            self._still_wanted()
            p.commit_transaction(self._timeout)
            self._open = False
            self._work.ended()
            return placed
        except BaseException as exc:
            self._abort(exc)
            raise

    def _append(self, records: Sequence[OutRecord]) -> list[int]:
        """Produces `records` in the transaction and waits for their delivery reports
        (`produce_all`); their offsets."""
        p = self._ready()
        if not self._open:
            p.begin_transaction()
            self._open = True
        self._work.wrote(r[0] for r in records)
        try:
            return produce_all(p, records, self._timeout)
        except BaseException as exc:
            self._abort(exc)
            raise

    def _abort(self, exc: BaseException) -> None:
        """Aborts the open transaction after `exc`, unless it was a fence or left the
        producer in a fatal state (nothing more it can do: the broker aborts it). An
        abort that fails fatally is raised in `exc`'s place: it names the producer's
        state, where `exc` may not (below)."""
        if not self._open or self._producer is None:
            return
        self._open = False
        error = error_of(exc)
        if error is not None and (error.fatal() or error.code() in FENCED_CODES):
            return
        try:
            self._producer.abort_transaction(self._timeout)
        except KafkaException as abort:
            cause = error_of(abort)
            if cause is not None and (cause.fatal() or cause.code() in FENCED_CODES):
                # A fence (or an ACL refusal) met while records were still produced makes
                # later `produce` calls fail with `_FATAL` alone, not the error itself;
                # the abort raises what it is. Taken for a plain failure, the partition
                # would be retaken at once and fence its new owner in turn.
                raise abort from exc
            logger.warning("%s: abort failed: %s", self.transactional_id, said(abort))

    def _still_wanted(self) -> None:
        """Raises (the transaction is then aborted) once the event loop gave up on the
        call (its deadline passed, its caller cancelled: the writer broken), so that no
        step of it follows: its caller was told it failed."""
        if (broken := self.broken) is not None:
            raise KafkaUnavailable(f"given up on the thread: {broken}")

    def _ready(self) -> Producer:
        if self._producer is None:
            raise KafkaUnavailable(f"{self.transactional_id}: not started")
        return self._producer

    def _said(self, error: KafkaError) -> None:
        """librdkafka's error callback (a broker down, a fatal error): logged; the call it
        concerns raises it too."""
        logger.info("%s: %s", self.transactional_id, error)

    # On the event loop.

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        """`call` on the writer's thread. Past the deadline (librdkafka keeps a call past
        its own timeout while the broker is unreachable) `KafkaUnavailable`: the caller
        breaks the writer, and the call goes on on the thread, before the stop."""
        done = asyncio.wrap_future(self._thread.submit(call, *args))  # set thread-safely
        try:
            return await asyncio.wait_for(asyncio.shield(done), self._deadline)
        except TimeoutError:
            done.add_done_callback(_retrieve)
            raise KafkaUnavailable(f"no answer in {self._deadline:g} s") from None
        except asyncio.CancelledError:
            done.add_done_callback(_retrieve)  # its end, failed or not, is nobody's
            raise

    def _check(self) -> None:
        if self.broken is not None:
            raise self.broken

    def _fail(self, exc: BaseException) -> BaseException:
        """Breaks the writer: what to raise for `exc`. A cancelled commit goes on on the
        writer's thread, its end unknown here (the broker aborts an open transaction at
        the next writer's start, or at its timeout)."""
        error = error_of(exc)
        if error is not None and (error.code() in FENCED_CODES):
            broken: KafkaUnavailable = Fenced(
                f"{self.transactional_id} was fenced by a newer owner"
            )
        elif isinstance(exc, KafkaUnavailable):
            broken = KafkaUnavailable(f"{self.transactional_id}: transaction failed: {exc}")
        else:
            why = self._explained(exc) if error is not None else repr(exc)
            broken = KafkaUnavailable(f"{self.transactional_id}: transaction failed: {why}")
        broken.__cause__ = aiokafka_cause(exc)
        self.broken = broken
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
            return exc
        return broken

    def _explained(self, exc: BaseException) -> str:
        """librdkafka's error in `exc` in a user's terms (`rdkafka_errors.said`); an ACL
        refusal naming what of the transaction it refused and the ACL to add, as the
        aiokafka writer's (`records.refused_work`)."""
        refused = self._work.refusal(aiokafka_cause(exc), self._principal, lambda _: said(exc))
        return said(exc) if refused is None else refused


class _Log:
    """librdkafka's log lines, into this module's logger (confluent-kafka calls `log`).
    A fence is a partition moving to another node, which the node says itself: librdkafka
    logs it as a fatal error (CRITICAL, ERROR), here it is INFO."""

    def log(self, level: int, fmt: str, *args: object) -> None:
        if level > logging.INFO and any("fenced" in str(a) for a in args):
            level = logging.INFO
        logger.log(level, fmt, *args)


_LOG = _Log()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
