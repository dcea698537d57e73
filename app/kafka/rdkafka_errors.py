"""librdkafka's errors in the project's terms: the error an exception carries
(`error_of`), the error aiokafka's writer would raise for it where the node tells it apart
(`aiokafka_cause`: a refusal, a partition short of in-sync replicas, a record or batch too
large), and what a user is
told of it (`said`). For `rdkafka_writer` and its delivery (`rdkafka_delivery`)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from app.kafka.rdkafka_config import explain_code, refusal, short_of_replicas, too_large

__all__ = ["Refused", "aiokafka_cause", "error_of", "said"]


class Refused(Exception):
    """A record the broker did not take (its delivery report's error)."""

    def __init__(self, error: KafkaError) -> None:
        super().__init__(error)
        self.error = error


def error_of(exc: BaseException | None) -> KafkaError | None:
    """librdkafka's error in `exc` or in what it came from. confluent-kafka raises a fatal
    error (a fence) from the callback dispatch of `flush` or `close`, and leaves it set
    while the dispatch goes on: the next delivery report's callback then fails with a
    `SystemError` whose cause is the fatal `KafkaException`."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, Refused):
            return exc.error
        if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
            return exc.args[0]
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def aiokafka_cause(exc: BaseException) -> BaseException:
    """aiokafka's error for `exc`, caused by `exc`, when librdkafka's error in it is one the
    node tells apart as it does the aiokafka writer's: a refusal (an ACL missing, the login
    refused: `records.refused`, no retry passes it) or a write short of in-sync replicas
    (`records.short_of_replicas`: the cluster's state, waited out) or one refused as too
    large (`records.too_large`); `exc` otherwise."""
    error = error_of(exc)
    cause = (
        None
        if error is None
        else refusal(error.code(), error.str())
        or short_of_replicas(error.code(), error.str())
        or too_large(error.code(), error.str())
    )
    if cause is None:
        return exc
    cause.__cause__ = exc
    return cause


def said(exc: BaseException) -> str:
    error = error_of(exc)
    if error is None:
        return repr(exc)
    return explain_code(error.code(), f"{error.name()}: {error.str()}")
