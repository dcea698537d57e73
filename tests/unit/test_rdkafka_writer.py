"""librdkafka's writer without a broker: a call that librdkafka keeps past its deadline
breaks the writer (the partition is let go) instead of holding its caller for ever; a
fence that confluent-kafka reports as a `SystemError` (its fatal error left set while its
callbacks go on) is still `Fenced`; a refusal is one, and a write short of in-sync
replicas the cluster's state, as the aiokafka writer's."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
from typing import ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from app.errors import Fenced, KafkaUnavailable
from app.kafka.rdkafka_errors import Refused, aiokafka_cause
from app.kafka.rdkafka_errors import error_of as _error_of
from app.kafka.rdkafka_writer import RdkafkaTransactionalWriter
from app.kafka.records import refused, short_of_replicas
from app.node.partition_take import take_failure


async def test_a_call_past_its_deadline_breaks_the_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t", deadline=0.05)
    release = threading.Event()
    monkeypatch.setattr(writer, "_transaction", lambda *_: release.wait())
    try:
        with pytest.raises(KafkaUnavailable, match=r"no answer in 0\.05 s"):
            await writer.commit([], {}, "g")
        assert writer.broken is not None and not isinstance(writer.broken, Fenced)
        with pytest.raises(KafkaUnavailable):  # broken for good: at once, on no thread
            await writer.commit([], {}, "g")
    finally:
        release.set()
        await writer.stop()


def fatal(code: int) -> KafkaException:
    error = KafkaError(code, "fenced", fatal=True)
    return KafkaException(error)


def test_a_fence_under_a_system_error_is_found() -> None:
    try:
        try:
            raise fatal(KafkaError._FENCED)
        except KafkaException as inner:
            raise SystemError("append returned a result with an exception set") from inner
    except SystemError as outer:
        error = _error_of(outer)
    assert error is not None and error.code() == KafkaError._FENCED


async def test_a_fence_breaks_the_writer_as_fenced(monkeypatch: pytest.MonkeyPatch) -> None:
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t")

    def fenced(*_: object) -> list[int]:
        raise SystemError("callback failed") from fatal(KafkaError.PRODUCER_FENCED)

    monkeypatch.setattr(writer, "_transaction", fenced)
    with pytest.raises(Fenced):
        await writer.commit([], {}, "g")
    assert isinstance(writer.broken, Fenced)
    await writer.stop()


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._where = (topic, partition, offset)

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]


class FakeProducer:
    """confluent-kafka's producer whose `flush` waits for `release` (the broker slow to
    answer), then delivers every record; its calls, in order."""

    release = threading.Event()
    flushing = threading.Event()
    calls: ClassVar[list[str]] = []

    def __init__(self, config: dict[str, object]) -> None:
        self._reports: list[tuple[object, FakeMessage]] = []

    def init_transactions(self, *_: object) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, value: object, key: object, partition: int, **kw: object) -> None:
        self._reports.append((kw["on_delivery"], FakeMessage(topic, partition, len(self._reports))))

    def flush(self, *_: object) -> int:
        self.calls.append("flush")
        self.flushing.set()
        self.release.wait()
        for report, msg in self._reports:
            report(None, msg)  # type: ignore[operator]
        return 0

    def poll(self, *_: object) -> int:
        return 0

    def send_offsets_to_transaction(self, *_: object) -> None:
        self.calls.append("offsets")

    def commit_transaction(self, *_: object) -> None:
        self.calls.append("commit")

    def abort_transaction(self, *_: object) -> None:
        self.calls.append("abort")

    def purge(self) -> None:
        self.calls.append("purge")

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture
def slow_broker(monkeypatch: pytest.MonkeyPatch) -> type[FakeProducer]:
    FakeProducer.release = threading.Event()
    FakeProducer.flushing = threading.Event()
    FakeProducer.calls = []
    monkeypatch.setattr("app.kafka.rdkafka_writer.Producer", FakeProducer)
    return FakeProducer


async def test_a_commit_past_its_deadline_never_commits_after(
    slow_broker: type[FakeProducer],
) -> None:
    """The caller of a commit past its deadline is told it failed: the call that goes on
    on the writer's thread aborts its transaction instead of committing it later."""
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t", deadline=0.05)
    await writer.start()
    with pytest.raises(KafkaUnavailable):
        await writer.commit([("events", 0, b"k", b"v")], {("in", 0): 1}, "g")
    slow_broker.release.set()
    await writer.stop()  # after the call, on its thread
    assert "commit" not in slow_broker.calls and "abort" in slow_broker.calls


async def test_a_cancelled_commit_never_commits_after(slow_broker: type[FakeProducer]) -> None:
    """A cancelled commit breaks the writer; its call, still on the writer's thread, aborts
    its transaction, and its failure is retrieved (never logged as unretrieved)."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t")
    await writer.start()
    commit = asyncio.ensure_future(writer.commit([("events", 0, b"k", b"v")], {}, "g"))
    await asyncio.to_thread(slow_broker.flushing.wait)  # the records are being flushed
    commit.cancel()
    with pytest.raises(asyncio.CancelledError):
        await commit
    assert writer.broken is not None
    slow_broker.release.set()
    await writer.stop()
    del commit
    gc.collect()
    await asyncio.sleep(0)
    assert "commit" not in slow_broker.calls and "abort" in slow_broker.calls
    assert unhandled == []


STUCK_AT_EXIT = """
import asyncio, threading
from app.errors import KafkaUnavailable
from app.kafka.rdkafka_writer import RdkafkaTransactionalWriter

async def main() -> None:
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t", deadline=0.05)
    writer._transaction = lambda *_: threading.Event().wait()  # librdkafka never answers
    try:
        await writer.commit([], {}, "g")
    except KafkaUnavailable:
        pass
    await writer.stop()
    print("stopped", flush=True)

asyncio.run(main())
"""


def test_a_call_stuck_on_its_thread_does_not_hold_the_interpreter_at_exit() -> None:
    """A writer stopped while librdkafka still holds its thread (a call past its deadline)
    lets the process exit: the thread is no reason to stay (an open transaction is the
    broker's to abort), where an executor's thread is joined at exit, for ever."""
    done = subprocess.run(
        [sys.executable, "-c", STUCK_AT_EXIT],
        capture_output=True,
        text=True,
        timeout=60,  # a hang guard, not a figure: the exit comes at once or never
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
    ],
)
async def test_a_refusal_is_one_for_records_refused_in_start_and_commit(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A denial is not retried (`records.refused`), as the aiokafka writer's is not."""
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t")

    def denied(*_: object) -> list[int]:
        raise KafkaException(KafkaError(code, "denied"))

    monkeypatch.setattr(writer, "_start", denied)
    monkeypatch.setattr(writer, "_transaction", denied)
    try:
        with pytest.raises(KafkaUnavailable) as started:
            await writer.start()
        assert refused(started.value)
        with pytest.raises(KafkaUnavailable) as committed:
            await writer.commit([], {}, "g")
        assert refused(committed.value) and writer.broken is committed.value
    finally:
        await writer.stop()


async def test_a_failure_other_than_a_refusal_is_no_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t")

    def down(*_: object) -> list[int]:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))

    monkeypatch.setattr(writer, "_start", down)
    monkeypatch.setattr(writer, "_transaction", down)
    try:
        with pytest.raises(KafkaUnavailable) as started:
            await writer.start()
        assert not refused(started.value)
        with pytest.raises(KafkaUnavailable) as committed:
            await writer.commit([], {}, "g")
        assert not refused(committed.value)
    finally:
        await writer.stop()


@pytest.mark.parametrize(
    "code", [KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND]
)
@pytest.mark.parametrize("delivered", [False, True])
async def test_a_write_short_of_in_sync_replicas_is_the_clusters_state(
    monkeypatch: pytest.MonkeyPatch, code: int, delivered: bool
) -> None:
    """As the aiokafka writer's `NotEnoughReplicasError`: a take it fails waits for the
    replicas (`take_failure` "cluster"), counting no attempt, and is no refusal; from a
    commit's call or from a record's delivery report (`Refused`)."""
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t")

    def short(*_: object) -> list[int]:
        error = KafkaError(code, "Broker: Not enough in-sync replicas")
        raise Refused(error) if delivered else KafkaException(error)

    monkeypatch.setattr(writer, "_transaction", short)
    try:
        with pytest.raises(KafkaUnavailable) as committed:
            await writer.commit([], {}, "g")
        assert short_of_replicas(committed.value) and not refused(committed.value)
        assert take_failure(committed.value) == "cluster"
        assert "Not enough in-sync replicas" in str(committed.value)
    finally:
        await writer.stop()


def test_other_failures_are_not_short_of_replicas() -> None:
    for code in (KafkaError._TRANSPORT, KafkaError.TOPIC_AUTHORIZATION_FAILED):
        assert not short_of_replicas(aiokafka_cause(KafkaException(KafkaError(code, "x"))))


class RefusingProducer(FakeProducer):
    """confluent-kafka's producer (the broker answering at once) that refuses a step with
    librdkafka's error `code`: "start" (InitProducerId), "records" (their delivery
    reports) or "offsets" (AddOffsetsToTxn, TxnOffsetCommit)."""

    refused_at: ClassVar[str] = "offsets"
    code: ClassVar[int] = KafkaError.GROUP_AUTHORIZATION_FAILED

    def _refusal(self) -> KafkaError:
        return KafkaError(self.code, "Broker: authorization failed")

    def init_transactions(self, *_: object) -> None:
        super().init_transactions()
        if self.refused_at == "start":
            raise KafkaException(self._refusal())

    def flush(self, *_: object) -> int:
        for report, msg in self._reports:
            refused = self.refused_at == "records"
            report(self._refusal() if refused else None, msg)  # type: ignore[operator]
        return 0

    def send_offsets_to_transaction(self, *_: object) -> None:
        super().send_offsets_to_transaction()
        if self.refused_at == "offsets":
            raise KafkaException(self._refusal())


@pytest.mark.parametrize(
    ("at", "code", "doing", "acl"),
    [
        (
            "offsets",
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            "committing group g's offsets of in[0], in.timers[0] was refused: not authorized "
            "on the consumer group",
            "--operation Read --group g",
        ),
        (
            "offsets",
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            "committing group g's offsets of in[0], in.timers[0] was refused: not authorized "
            "on a topic",
            "--operation Read --topic in --topic in.timers",
        ),
        (
            "records",
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            "writing to events was refused: not authorized on a topic",
            "--operation Write --topic events",
        ),
        (
            "start",
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "its transactional id t was refused: not authorized on a transactional id",
            "--operation Write --transactional-id t",
        ),
    ],
)
async def test_a_refusal_names_what_it_refused_and_the_acl_to_add(
    monkeypatch: pytest.MonkeyPatch, at: str, code: int, doing: str, acl: str
) -> None:
    """As the aiokafka writer's: librdkafka's refusal names no group nor topic; the
    writer's message names what of its transaction was refused and the ACL to add."""
    monkeypatch.setattr(RefusingProducer, "refused_at", at)
    monkeypatch.setattr(RefusingProducer, "code", code)
    monkeypatch.setattr(RefusingProducer, "calls", [])
    monkeypatch.setattr("app.kafka.rdkafka_writer.Producer", RefusingProducer)
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "t")
    try:
        with pytest.raises(KafkaUnavailable) as e:
            await writer.start()
            await writer.commit(
                [("events", 0, b"k", b"v")], {("in.timers", 0): 3, ("in", 0): 9}, "g"
            )
        said = str(e.value)
        assert doing in said, said
        assert "Connecting to your Kafka" in said and refused(e.value)
        assert said.endswith(f"kafka-acls.sh --add --allow-principal User:<principal> {acl}")
    finally:
        await writer.stop()


class FencedWhileProducing(FakeProducer):
    """A producer fenced (or refused) between two records of a transaction: librdkafka's
    `produce` then fails with `_FATAL` alone, and the abort raises the fatal error itself."""

    underlying = KafkaError._FENCED

    def __init__(self, config: dict[str, object]) -> None:
        super().__init__(config)
        self.produced = 0

    def produce(self, topic: str, value: object, key: object, partition: int, **kw: object) -> None:
        self.produced += 1
        if self.produced > 1:
            raise KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error"))
        super().produce(topic, value, key, partition, **kw)

    def abort_transaction(self, *_: object) -> None:
        raise KafkaException(KafkaError(self.underlying, "underlying", fatal=True))


@pytest.mark.parametrize(
    "underlying",
    [KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH],
)
async def test_a_fence_met_while_producing_breaks_the_writer_as_fenced(
    monkeypatch: pytest.MonkeyPatch, underlying: int
) -> None:
    monkeypatch.setattr(FencedWhileProducing, "underlying", underlying)
    monkeypatch.setattr("app.kafka.rdkafka_writer.Producer", FencedWhileProducing)
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "g.t.0")
    await writer.start()
    try:
        with pytest.raises(Fenced):
            await writer.commit([("t", 0, b"k", b"v")] * 3, {}, "g")
        assert isinstance(writer.broken, Fenced)
    finally:
        await writer.stop()


async def test_a_refusal_met_while_producing_is_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FencedWhileProducing, "underlying", 29)  # TOPIC_AUTHORIZATION_FAILED
    monkeypatch.setattr("app.kafka.rdkafka_writer.Producer", FencedWhileProducing)
    writer = RdkafkaTransactionalWriter("127.0.0.1:1", "g.t.0")
    await writer.start()
    try:
        with pytest.raises(KafkaUnavailable) as caught:
            await writer.commit([("t", 0, b"k", b"v")] * 3, {}, "g")
        assert not isinstance(caught.value, Fenced)
        assert refused(caught.value)
    finally:
        await writer.stop()
