"""A librdkafka transaction's records produced and their delivery reports served: the
offset of each record (`produce_all`), a record the broker did not take raised as
`rdkafka_errors.Refused`. On the writer's thread (`rdkafka_writer`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, Message, Producer

from app.errors import KafkaUnavailable
from app.kafka.rdkafka_errors import Refused
from app.kafka.records import OutRecord, headers_of

__all__ = ["produce_all"]

_QUEUE_FULL_WAIT = 0.05
"""A `produce` refused for a full local queue waits this long for deliveries, then again."""


def produce_all(p: Producer, records: Sequence[OutRecord], timeout: float) -> list[int]:
    """Produces `records` and serves their delivery reports (`flush`, at most `timeout`
    seconds); their offsets. Records of a topic given their partition share one report
    collector (a partition's offsets grow in the order its records were produced); a
    topic with a record left to the key's partition is told record by record."""
    keyed = {r[0] for r in records if r[1] is None}
    at: list[int] = [-1] * len(records)
    delivered: list[Message] = []
    failed: list[KafkaError] = []

    def collect(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(err)
        else:
            delivered.append(msg)

    def one(i: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(err)
        else:
            at[i] = _offset(msg)

    by_partition: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(records):
        topic, partition = r[0], r[1]
        if topic in keyed:
            _produce(p, r, -1 if partition is None else partition, functools.partial(one, i))
        else:
            assert partition is not None
            by_partition.setdefault((topic, partition), []).append(i)
            _produce(p, r, partition, collect)
    left = p.flush(timeout)
    if failed:
        raise Refused(failed[0])
    if left:
        raise KafkaUnavailable(f"{left} records not delivered in {timeout:g} s")
    offsets: dict[tuple[str, int], list[int]] = {}
    for m in delivered:
        offsets.setdefault((m.topic() or "", m.partition() or 0), []).append(_offset(m))
    for where, indexes in by_partition.items():
        for i, offset in zip(indexes, sorted(offsets.get(where, ())), strict=True):
            at[i] = offset
    return at


def _produce(
    p: Producer, r: OutRecord, partition: int, report: Callable[[KafkaError | None, Message], None]
) -> None:
    headers = headers_of(r)
    while True:
        try:
            if headers:
                p.produce(r[0], r[3], r[2], partition, on_delivery=report, headers=list(headers))
            else:
                p.produce(r[0], r[3], r[2], partition, on_delivery=report)
            return
        except BufferError:  # the local queue is full: serve deliveries, then again
            p.poll(_QUEUE_FULL_WAIT)


def _offset(msg: Message) -> int:
    offset = msg.offset()
    if offset is None or offset < 0:  # acknowledged without one: a client bug
        raise KafkaUnavailable(f"{msg.topic()}[{msg.partition()}]: delivered without offset")
    return offset
