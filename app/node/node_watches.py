"""What a node's run watches beside its partitions, any of which ending stops the node
loudly (they retry what passes by itself): the tasks it starts for the run (`start_watches`:
each ledger's naming of the PARKED timers its resolved entries may hide, the topic policy
watch, the plain producer's failure, the reload of renewed TLS files), and a supervisor for
each of those and of the followers its sends depend on (`supervisors`). May import
`app.kafka`'s ports and tls_reload, `app.node`'s kept, parked_names and topic_watch,
`app.task_ends` and `app.timers`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping

from app.kafka.ports import PublisherClient
from app.kafka.tls_reload import TlsReload
from app.node.kept import KeptType
from app.node.parked_names import keep_parked_named
from app.node.topic_watch import TopicPolicyWatch
from app.task_ends import how_ended
from app.timers.ledger import KafkaFailureLedger
from app.timers.runner import TimerRunner

__all__ = ["start_watches", "supervisors"]


def start_watches(
    ledgers: Mapping[str, KafkaFailureLedger],
    types: Mapping[str, KeptType],
    topic_watch: TopicPolicyWatch,
    producer: PublisherClient,
    tls: TlsReload | None = None,
) -> dict[str, asyncio.Task[None]]:
    """The tasks a node's run starts beside its partitions, by what its failure calls each
    (the run cancels them when it ends); `tls`: the node's TLS files, if any to read."""
    # Each ledger's resolved entries: the PARKED timers they may hide named again.
    watches = {
        f"naming the parked timers of {c}": asyncio.create_task(
            keep_parked_named(ledger, functools.partial(_runners_of, types, c)),
            name=f"naming the parked timers of {c}",
        )
        for c, ledger in ledgers.items()
    }
    watches["the topic policy watch"] = asyncio.create_task(
        topic_watch.run(), name="topic policy watch"
    )
    # The plain producer (remote sends, the ledgers' writes): sending no more, for good.
    watches["the producer"] = asyncio.create_task(producer.failed(), name="producer")
    # Renewed client certificates and CAs loaded for the clients' next connections.
    if tls is not None:
        watches["the TLS reload"] = asyncio.create_task(tls.run(), name="TLS reload")
    return watches


def supervisors(
    watched: Mapping[str, asyncio.Task[None] | None], fail: Callable[[str], None]
) -> list[asyncio.Task[None]]:
    """A supervisor of each task of `watched` (None: not started), which stops the node
    (`fail`, with what it is called and how it ended) when that task ends."""
    return [
        asyncio.create_task(_supervise(what, task, fail), name=f"supervising {what}")
        for what, task in watched.items()
        if task is not None
    ]


def _runners_of(types: Mapping[str, KeptType], context: str) -> list[TimerRunner]:
    return [k.runner for k in types.values() if k.topics.context == context]


async def _supervise(what: str, task: asyncio.Task[None], fail: Callable[[str], None]) -> None:
    """Stops the node loudly when `task` ends (they retry what passes by itself)."""
    await asyncio.wait([task])
    # Its task is stopped by the node's stop, after the run (this supervisor with it)
    # ended: an end seen here, a cancellation included, is while the node runs.
    fail(f"{what} {how_ended(task)}")
