"""A thread of its own for a blocking client's calls (librdkafka's, through confluent-kafka):
its calls one at a time and in order, their results as `concurrent.futures.Future`s (the
event loop waits on them through `asyncio.wrap_future`). Imports only `app.errors`."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from app.errors import KafkaUnavailable

__all__ = ["CallThread"]

T = TypeVar("T")


class CallThread:
    """A writer's thread: its calls, one at a time and in order. A daemon, where an
    executor's thread is joined at the interpreter's exit: a call librdkafka holds past
    its deadline (the writer broken, stopped) would hold the process for ever. Killed at
    exit, it commits nothing: an open transaction is the broker's to abort."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]]
        self._calls = queue.SimpleQueue()
        self._started = False
        self._closed = False

    def submit(self, call: Callable[..., T], *args: Any) -> Future[T]:
        if self._closed:
            raise KafkaUnavailable("stopped")
        if not self._started:  # at its first call, as an executor's (many writers wait)
            self._started = True
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()
        future: Future[T] = Future()
        self._calls.put((future, call, args))
        return future

    @property
    def closed(self) -> bool:
        """Whether it was shut down (it takes no call more)."""
        return self._closed

    def shutdown(self) -> None:
        """Ends the thread after the calls it was given; at once if it had none."""
        if not self._closed:
            self._closed = True
            self._calls.put((Future(), _last, ()))

    def _serve(self) -> None:
        while True:
            future, call, args = self._calls.get()
            if call is _last:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call(*args)
            except BaseException as exc:  # the caller's, as an executor's
                future.set_exception(exc)
            else:
                future.set_result(result)


def _last() -> None:
    """The call that ends a writer's thread."""
