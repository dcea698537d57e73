"""A transactional producer that fails is broken for good: whatever aiokafka raised (fenced,
a fatal state's AssertionError), the caller gets our error and every later call fails at
once, so no partition goes on with a producer in an unknown state."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IllegalOperation,
    KafkaError,
    ProducerFenced,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.producer.sender import Sender
from aiokafka.producer.transaction_manager import TransactionManager, TransactionResult
from pydantic import SecretStr

from app.errors import (
    Fenced,
    KafkaUnavailable,
)
from app.kafka import TransactionalProducer
from app.kafka.connection import KafkaConnection
from app.kafka.records import refused, refused_topics
from app.node.kept import is_fenced


class FakeClient:
    """aiokafka's producer, failing its commit with `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.calls: list[str] = []
        # aiokafka's transaction state, looked at when a step fails.
        self._txn_manager: TransactionManager | None = None

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not sent in these tests")

    async def send_offsets_to_transaction(self, *args: Any) -> None:
        self.calls.append("offsets")

    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        raise self.error

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def stop(self) -> None:
        self.calls.append("stop")
        raise RuntimeError("a broken client may fail to stop too")


async def producer_with(client: FakeClient) -> TransactionalProducer:
    producer = TransactionalProducer("127.0.0.1:1", "g.shop.order.timers.3")
    await producer._producer.stop()  # the real client, never started: closed, not leaked
    producer._producer = client
    return producer


async def test_an_assertion_from_a_fatal_state_breaks_the_producer() -> None:
    client = FakeClient(AssertionError("Invalid state transition FATAL_ERROR -> COMMITTING"))
    producer = await producer_with(client)
    with pytest.raises(KafkaUnavailable, match="transaction failed"):
        await producer.flush({("shop.order.commands", 3): 10}, "g")
    assert producer.broken is not None and not producer.pending
    assert client.calls == ["begin", "offsets", "commit", "abort"]
    with pytest.raises(KafkaUnavailable):
        await producer.commit([], {("shop.order.commands", 3): 11}, "g")
    assert client.calls[-1] == "abort", "a broken producer makes no call to the broker"
    await producer.stop()  # never raises


async def test_a_fenced_producer_says_so_and_does_not_abort() -> None:
    client = FakeClient(ProducerFenced())
    producer = await producer_with(client)
    with pytest.raises(Fenced, match="fenced by a newer owner"):
        await producer.flush({("shop.order.commands", 3): 10}, "g")
    assert "abort" not in client.calls, "the newer owner's start aborted it"
    with pytest.raises(Fenced):
        await producer.flush({("shop.order.commands", 3): 11}, "g")


async def test_a_fence_seen_by_the_sender_is_said_and_retrieved_whatever_the_step_raised() -> None:
    """aiokafka's sender died on the fence: the next step raises something else (here
    IllegalOperation: the transaction's state is FATAL_ERROR), and the fence waits in the
    transaction's end waiter, which nobody awaits. It is `Fenced` (the partition let go,
    not taken afresh at once, which would fence the newer owner in turn), and the waiter's
    exception is retrieved, not left for the loop to log at collection."""
    txn = TransactionManager("g.shop.order.timers.3", 60_000)
    txn.set_pid_and_epoch(7, 0)
    txn.begin_transaction()
    txn.fatal_error(ProducerFenced())
    client = FakeClient(IllegalOperation("Not in the middle of a transaction"))
    client._txn_manager = txn
    producer = await producer_with(client)
    loop = asyncio.get_running_loop()
    logged: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: logged.append(context))
    try:
        with pytest.raises(Fenced, match="fenced by a newer owner"):
            await producer.flush({("shop.order.commands", 3): 10}, "g")
        assert "abort" not in client.calls
        await producer.stop()
        del txn, client, producer
        gc.collect()
        assert logged == []
    finally:
        loop.set_exception_handler(None)


@pytest.fixture
async def guarded(
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[TransactionalProducer, list[TransactionResult]]]:
    """A producer (never started) whose guarded commit step (`_guard_commit`) runs alone:
    the batches it waits for are the test's futures, and how aiokafka's own step would
    end the transaction is recorded (commit or abort), not sent."""
    ended: list[TransactionResult] = []

    async def end(_sender: Sender, result: TransactionResult) -> None:
        ended.append(result)

    monkeypatch.setattr(Sender, "_do_txn_commit", end)
    producer = TransactionalProducer("127.0.0.1:1", "g.shop.order.timers.3")

    async def flushed() -> None:
        pass

    sender = producer._producer._sender
    monkeypatch.setattr(sender._message_accumulator, "flush_for_commit", flushed)
    try:
        yield producer, ended
    finally:
        await producer._producer.stop()


async def test_a_commit_whose_caller_gave_up_before_its_end_aborts(
    guarded: tuple[TransactionalProducer, list[TransactionResult]],
) -> None:
    """A commit cancelled while its batches are still in flight breaks the producer at
    once; aiokafka's sender, which goes on with the commit, then ends the transaction
    with an abort: records the caller was told nothing of never commit after it."""
    producer, ended = guarded
    sender = producer._producer._sender
    batch: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    producer._sent = [batch]
    ending = asyncio.ensure_future(sender._do_txn_commit(TransactionResult.COMMIT))
    await asyncio.sleep(0)  # the sender waits for the batch
    producer.broken = KafkaUnavailable("cancelled mid-commit")  # as `_fail` does
    batch.set_result(None)
    await ending
    assert ended == [TransactionResult.ABORT]


@pytest.mark.parametrize("outcome", ["acknowledged", "cancelled", "refused"])
async def test_a_commit_with_a_send_never_acknowledged_aborts(
    guarded: tuple[TransactionalProducer, list[TransactionResult]], outcome: str
) -> None:
    """A batch whose future was cancelled (or failed) was never acknowledged: the
    transaction is aborted, not committed without it; an acknowledged one commits."""
    producer, ended = guarded
    batch: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    if outcome == "cancelled":
        batch.cancel()
    elif outcome == "refused":
        batch.set_exception(KafkaUnavailable("record too large"))
        batch.exception()  # retrieved, as the producer's callback does
    else:
        batch.set_result(None)
    producer._sent = [batch]
    await producer._producer._sender._do_txn_commit(TransactionResult.COMMIT)
    committed = outcome == "acknowledged"
    assert ended == [TransactionResult.COMMIT if committed else TransactionResult.ABORT]
    assert (producer._unsent is None) is committed


async def test_a_refusal_seen_by_the_sender_is_what_the_failure_comes_from() -> None:
    """An ACL taken away mid-transaction: aiokafka's sender puts the transaction in error
    on the refused AddPartitionsToTxn, and the next step raises IllegalOperation, which
    hides it. The failure comes from the refusal (`refused`: no retry passes it), naming
    the topic, so the node knows whose topic it was."""
    txn = TransactionManager("g.shop.order.timers.3", 60_000)
    txn.set_pid_and_epoch(7, 0)
    txn.begin_transaction()
    txn.error_transaction(TopicAuthorizationFailedError({"shop.order.timers"}))
    client = FakeClient(IllegalOperation("Can't send messages while not in transaction"))
    client._txn_manager = txn
    producer = await producer_with(client)
    with pytest.raises(KafkaUnavailable, match="TopicAuthorizationFailed") as e:
        await producer.flush({("shop.order.commands", 3): 10}, "g")
    assert refused(e.value) and refused_topics(e.value) == frozenset({"shop.order.timers"})
    await producer.stop()


class HangingClient(FakeClient):
    async def commit_transaction(self) -> None:
        self.calls.append("commit")
        await asyncio.Event().wait()


async def test_a_commit_cut_short_by_its_deadline_leaves_a_chain_of_causes_that_ends() -> None:
    """The node's commit deadline cancels a hung commit: the cancellation raised back was
    its own cause (`raise exc from exc`), and every walk down the causes (is it a fence?
    a refusal?) spun for ever, freezing the node's event loop."""
    producer = await producer_with(HangingClient(AssertionError("unused")))
    with pytest.raises(TimeoutError) as e:
        async with asyncio.timeout(0.05):
            await producer.flush({("shop.order.commands", 3): 10}, "g")
    seen: list[BaseException] = []
    exc: BaseException | None = e.value
    while exc is not None:
        assert exc not in seen, f"{exc!r} is its own cause, down the chain"
        seen.append(exc)
        exc = exc.__cause__
    assert not is_fenced(e.value) and not refused(e.value)
    await producer.stop()


class _StuckSender:
    """aiokafka's sender while a batch of the aborted transaction is retried for ever
    (NOT_ENOUGH_REPLICAS: an idempotent producer's batches never expire): its task runs
    until it is closed."""

    def __init__(self) -> None:
        self.sender_task: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def close(self) -> None:
        self.sender_task.cancel()
        await asyncio.gather(self.sender_task, return_exceptions=True)


class _StuckClient(FakeClient):
    """aiokafka's producer whose stop waits for its accumulator's flush or its sender's
    end (`AIOKafkaProducer.stop`), neither of which comes while the cluster is short of
    in-sync replicas."""

    def __init__(self) -> None:
        super().__init__(RuntimeError("unused"))
        self._sender = _StuckSender()
        self.client = _StuckSender()  # its connections: closed past the bound too

    async def stop(self) -> None:
        self.calls.append("stop")
        flushed = asyncio.get_running_loop().create_future()
        await asyncio.wait([flushed, self._sender.sender_task])


async def test_an_aborted_producer_whose_stop_waits_on_its_flush_stops_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An aborted transaction's batches, retried for as long as the cluster stayed short
    of in-sync replicas, held its producer's stop: each retake of the partition left one
    more producer behind, its sender retrying every 10 ms, its connections open."""
    from app.kafka import producers

    monkeypatch.setattr(producers, "STOP_WITHIN_S", 0.05)
    client = _StuckClient()
    producer = await producer_with(client)
    await asyncio.wait_for(producer.stop(), 2)
    assert client._sender.sender_task.done(), "its sender is stopped"
    assert client.client.sender_task.done(), "its connections are closed"


class RefusingClient(FakeClient):
    """aiokafka's producer whose offsets commit (`send_offsets_to_transaction`) is refused
    with `error`, as its sender raises it."""

    async def send_offsets_to_transaction(self, *args: Any) -> None:
        self.calls.append("offsets")
        raise self.error


OFFSETS = {("shop.order.commands", 3): 10, ("shop.order.timers", 3): 4}


def sender_died_of(refusal: BaseException) -> KafkaError:
    """What aiokafka's sender raises for a TxnOffsetCommit's TOPIC_AUTHORIZATION_FAILED:
    its handler raises the error with no topic, and the sender dies of it, wrapped."""
    died = KafkaError("Unexpected error during batch delivery")
    died.__cause__ = refusal
    return died


@pytest.mark.parametrize(
    ("error", "acl"),
    [
        (GroupAuthorizationFailedError("g"), "--operation Read --group g"),
        (
            sender_died_of(TopicAuthorizationFailedError()),
            "--operation Read --topic shop.order.commands --topic shop.order.timers",
        ),
    ],
)
async def test_a_refused_offsets_commit_names_the_group_its_partitions_and_the_acl(
    error: BaseException, acl: str
) -> None:
    """The group's Read or a topic's taken away: the node's stop said "not authorized"
    and no more (aiokafka's TxnOffsetCommit refusal names no topic): it names the group,
    the partitions whose offsets were committed, and the ACL to add, for its principal."""
    client = RefusingClient(error)
    producer = await producer_with(client)
    with pytest.raises(KafkaUnavailable) as e:
        await producer.flush(OFFSETS, "g")
    said = str(e.value)
    assert said.startswith("g.shop.order.timers.3: transaction failed: committing group g's ")
    assert "offsets of shop.order.commands[3], shop.order.timers[3] was refused: " in said
    assert "not authorized on " in said and "Connecting to your Kafka" in said
    assert said.endswith(
        f"; add the ACL missing: kafka-acls.sh --add --allow-principal User:<principal> {acl}"
    )
    assert refused(e.value)
    await producer.stop()


async def test_refused_records_name_their_topic_and_the_write_acl() -> None:
    txn = TransactionManager("g.shop.order.timers.3", 60_000)
    txn.set_pid_and_epoch(7, 0)
    txn.begin_transaction()
    txn.error_transaction(TopicAuthorizationFailedError({"shop.order.timers"}))
    client = FakeClient(IllegalOperation("Can't send messages while not in transaction"))
    client._txn_manager = txn
    producer = await producer_with(client)
    with pytest.raises(KafkaUnavailable) as e:
        await producer.flush(OFFSETS, "g")
    assert "writing to shop.order.timers was refused: not authorized on a topic" in str(e.value)
    assert str(e.value).endswith("--operation Write --topic shop.order.timers")
    await producer.stop()


class StartRefused(FakeClient):
    async def start(self) -> None:
        raise TransactionalIdAuthorizationFailed("g.shop.order.timers.3")


async def test_a_refused_transactional_id_names_it_and_the_acl_for_the_sasl_user() -> None:
    login = KafkaConnection(
        bootstrap_servers="127.0.0.1:1",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="tickwheel",
        sasl_password=SecretStr("secret"),
    )
    producer = TransactionalProducer(login, "g.shop.order.timers.3")
    await producer._producer.stop()
    producer._producer = StartRefused(AssertionError("unused"))
    with pytest.raises(KafkaUnavailable) as e:
        await producer.start()
    said = str(e.value)
    # As the secured broker's test reads it (tests/integration/test_secured_worker.py).
    assert "not authorized on a transactional id" in said
    assert said.endswith(
        "add the ACL missing: kafka-acls.sh --add --allow-principal User:tickwheel "
        "--operation Write --transactional-id g.shop.order.timers.3"
    )
    assert "secret" not in said
