"""Changes proposed to the node's partition producers, tried in a bench's workers without
making them (`bench.txn_steps` installs them before the worker starts, from its
environment): `TW_WARM_TOPICS=1` and `TW_THREADED_PRODUCERS=1`."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Mapping
from typing import Any


def install(environ: Mapping[str, str]) -> None:
    if environ.get("TW_THREADED_PRODUCERS"):
        threaded_producers()
    if environ.get("TW_WARM_TOPICS"):
        warm_at_start()


def warm_at_start() -> None:
    """`TW_WARM_TOPICS=1`, the change proposed to the node, tried without editing it: each
    partition's producer, at its start (the take), fetches the metadata of its type's
    events, commands and changelog topics (`TransactionalProducer.warm`), which its
    first fire writes."""
    from app.kafka import producers

    start = producers.TransactionalProducer.start

    @functools.wraps(start)
    async def warmed(self: Any) -> None:
        await start(self)
        context = os.environ["TW_TEST_CONTEXT"]
        aggregate = self.transactional_id.rsplit(".", 3)[-3]
        kinds = ("events", "commands", "timers")
        await self.warm([f"{context}.{aggregate}.{kind}" for kind in kinds])

    producers.TransactionalProducer.start = warmed  # type: ignore[method-assign]


def threaded_producers() -> None:
    """`TW_THREADED_PRODUCERS=1`, a change proposed to `app.kafka.producers`, tried without
    making it: each partition's transactional producer lives on one event loop of its
    own, in a thread, so that a commit's round trips (about 24 turns of aiokafka's loop)
    never wait for a turn of the node's busy loop; the node's calls hand over to it and
    back. Failure paths are not what this tries (a fence's futures are that loop's)."""
    import threading

    from app.kafka import clients, producers

    io = asyncio.new_event_loop()
    threading.Thread(target=io.run_forever, name="kafka-io", daemon=True).start()
    made = producers.TransactionalProducer

    class OnItsLoop:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            async def make() -> Any:
                return made(*args, **kwargs)

            self._inner = asyncio.run_coroutine_threadsafe(make(), io).result()
            self.transactional_id = self._inner.transactional_id

        @property
        def broken(self) -> Any:
            return self._inner.broken

        @property
        def pending(self) -> bool:
            return bool(self._inner.pending)

        async def _on(self, coro: Any) -> Any:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, io))

        async def start(self) -> None:
            await self._on(self._inner.start())

        async def stop(self) -> None:
            await self._on(self._inner.stop())

        async def warm(self, topics: Any) -> None:
            await self._on(self._inner.warm(list(topics)))

        async def commit(self, records: Any, offsets: Any, group_id: str) -> Any:
            return await self._on(self._inner.commit(list(records), dict(offsets), group_id))

        async def flush(self, offsets: Any = None, group_id: str = "") -> Any:
            return await self._on(self._inner.flush(offsets, group_id))

    vars(clients)["TransactionalProducer"] = OnItsLoop
