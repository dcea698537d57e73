"""Changes proposed to the node's partition producers, tried in a bench's workers without
making them (`bench.txn_steps` installs them before the worker starts, from its
environment): `TW_WARM_TOPICS=1`. (`TW_THREADED_PRODUCERS=1`, the producers on a loop
of their own, is what a node does since #20: `app.kafka.producer_loop`.)"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any


def install(environ: Mapping[str, str]) -> None:
    if environ.get("TW_WARM_TOPICS"):
        warm_at_start()


def warm_at_start() -> None:
    """`TW_WARM_TOPICS=1`, the change proposed to the node, tried without editing it: each
    partition's producer, at its start (the take), fetches the metadata of its type's
    events, commands and changelog topics (`TransactionalProducer.warm`), which its
    first fire writes."""
    from app.kafka.transactional_producer import TransactionalProducer

    start = TransactionalProducer.start

    @functools.wraps(start)
    async def warmed(self: Any) -> None:
        await start(self)
        context = os.environ["TW_TEST_CONTEXT"]
        aggregate = self.transactional_id.rsplit(".", 3)[-3]
        kinds = ("events", "commands", "timers")
        await self.warm([f"{context}.{aggregate}.{kind}" for kind in kinds])

    TransactionalProducer.start = warmed  # type: ignore[method-assign]
