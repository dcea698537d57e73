"""librdkafka's errors in the project's terms: the error an exception carries
(`error_of`), the refusal aiokafka's writer would raise for it (`refusal_or`), and what a
user is told of it (`said`). For `rdkafka_writer` and its delivery (`rdkafka_delivery`)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from app.kafka.rdkafka_config import explain_code, refusal

__all__ = ["Refused", "error_of", "refusal_or", "said"]


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


def refusal_or(exc: BaseException) -> BaseException:
    """aiokafka's error for `exc` when librdkafka's error in it is a refusal (an ACL missing,
    the login refused), caused by `exc`, so that `records.refused` knows it as the aiokafka
    writer's (no retry passes it); `exc` otherwise."""
    error = error_of(exc)
    cause = None if error is None else refusal(error.code(), error.str())
    if cause is None:
        return exc
    cause.__cause__ = exc
    return cause


def said(exc: BaseException) -> str:
    error = error_of(exc)
    if error is None:
        return repr(exc)
    return explain_code(error.code(), f"{error.name()}: {error.str()}")
