"""librdkafka's writer without a broker: a call that librdkafka keeps past its deadline
breaks the writer (the partition is let go) instead of holding its caller for ever; a
fence that confluent-kafka reports as a `SystemError` (its fatal error left set while its
callbacks go on) is still `Fenced`."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from app.errors import Fenced, KafkaUnavailable
from app.kafka.rdkafka_writer import RdkafkaTransactionalWriter, _error_of


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
