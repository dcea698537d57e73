"""What `tickwheel jobs` does on the bootstrap servers: `app.ops.job_api`'s functions (shared
with the web edge's `/jobs` routes), spelt for the command line (`--rule`, `--partition`),
with clients of the CLI's own."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import orjson

from app.cli.common import unsettled
from app.errors import JobsCliError
from app.jobs import SCHEDULE, TRIGGER, Job
from app.kafka import Producer, Reader, ensure_topics, require_topic
from app.kafka.cluster import count_differs
from app.kafka.connection import Connectable
from app.kafka.records import Replication
from app.node import node_topics
from app.ops import job_api
from app.ops.job_api import FAILED_CODES, InstanceState, cli_option, find_job, instance_commands
from app.protocol.limits import InputLimits
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope
from tables import AggregateRef
from tables.partitioner import partition_of

__all__ = [
    "FAILED_CODES",
    "InstanceState",
    "LogInstances",
    "find_job",
    "instance_commands",
    "parse_rule_option",
    "read_instance_events",
    "read_instances",
    "send_and_wait",
]

logger = logging.getLogger(__name__)


def parse_rule_option(text: str | None, job: Job) -> dict[str, Any] | None:
    """`--rule` as an instance's override (an object of rule fields; `null`: none), checked
    against the job's default as the aggregate will check it."""
    if text is None:
        return None
    try:
        parts = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise JobsCliError(f"--rule is not JSON: {exc}") from exc
    return job_api.rule_override(parts, job, cli_option)


async def send_and_wait(
    bootstrap: Connectable,
    partitions: int,
    commands: Sequence[CommandEnvelope],
    wait_s: float,
    replication: Replication,
) -> dict[str, CommandResult]:
    """Sends `commands` (all to one context's schedule), creating its topics as a worker
    would (with the workers' `replication`: made first here, they keep it for good), and
    for up to `wait_s` seconds waits for their results: those that came."""
    if not commands:
        return {}
    topics = AggregateTopics(commands[0].aggregate.context, SCHEDULE)
    await ensure_topics(bootstrap, node_topics([topics], partitions), replication)
    async with Reader(bootstrap) as reader:
        producer = Producer(bootstrap)
        await producer.start()
        try:
            sending = job_api.send_and_wait(producer, reader, partitions, commands, wait_s)
            if commands[0].type != TRIGGER:
                # The others apply at most once again anyway: an instance already so is
                # UNCHANGED, a backfilled slot keeps its live tick's request id.
                return await sending
            # A failure may follow the send: it names each run's request id, as a retry
            # under a fresh one would run it again.
            return await unsettled(sending, _resend(commands, partitions))
        finally:
            await producer.stop()


def _resend(commands: Sequence[CommandEnvelope], partitions: int) -> str:
    """How to send each trigger again under its request id: `--request-id` alone for one
    instance; for several, with the option that names its instance alone (one instance,
    its request id kept as given): `--tenant` for a TENANT job's (one id in each tenant),
    `--partition` for a SHARDED job's (its id lies in that partition)."""
    learn = "to learn what became of it (under its request id it runs at most once)"
    if len(commands) == 1:
        return f"send it again with --request-id {shlex.quote(commands[0].request_id)} {learn}"
    by_tenant = len({c.aggregate.id for c in commands}) == 1
    each = "; ".join(
        (
            f"--tenant {shlex.quote(c.aggregate.tenant)}"
            if by_tenant
            else f"--partition {partition_of(c.aggregate.id, partitions)}"
        )
        + f" --request-id {shlex.quote(c.request_id)}"
        for c in commands
    )
    return f"send each run again {learn}: {each}"


class LogInstances(NamedTuple):
    """The instances of a context's jobs as its schedule log has them, and the log's
    partition count they were read with."""

    partitions: int
    states: list[InstanceState]


async def read_instances(
    bootstrap: Connectable, context: str, jobs: Iterable[Job], limits: InputLimits
) -> LogInstances:
    """The instances of `context`'s jobs folded from its schedule log, as they are now
    (its records held to `limits`, the workers' bounds), read with the log's own partition
    count, as the read-only commands read a topic: TICKWHEEL_PARTITIONS of another count
    would look for each instance in another partition and pass its records over as
    misrouted, showing no state at all.

    Creates no topic: `MissingTopic` when the log is not there (no instance was enabled).
    """
    topics = AggregateTopics(context, SCHEDULE)
    have = await require_topic(
        bootstrap, topics.events, f"no instance of {context}'s jobs has been enabled there"
    )
    async with Reader(bootstrap) as reader:
        states = await job_api.read_instances(reader, context, jobs, have, have, limits)
    return LogInstances(have, states)


async def read_instance_events(
    bootstrap: Connectable, ref: AggregateRef, partitions: int, limits: InputLimits
) -> list[EventEnvelope]:
    """The events of the job instance `ref`, in log order, from its partition of its
    context's schedule log (held to the workers' `limits`). For a backfill, which writes
    with `partitions`: a log of another count is refused as the commands that write refuse
    it (`count_differs`), before anything is planned; read with the wrong count, the
    instance's events are passed over and the plan finds no slot. Creates no topic:
    `MissingTopic` when the log is not there."""
    topics = AggregateTopics(ref.context, SCHEDULE)
    have = await require_topic(
        bootstrap, topics.events, f"no instance of {ref.context}'s jobs has been enabled there"
    )
    if have != partitions:
        raise count_differs(topics.events, have, partitions)
    async with Reader(bootstrap) as reader:
        return await job_api.read_instance_events(reader, ref, partitions, limits)
