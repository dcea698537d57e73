"""A command a decision sends to another context's commands topic that refuses it: the
partition's transaction holding it fails once, not at every retake.

Made with a smaller `max.message.bytes` than the command (the broker's check, modelled by
`refusing`): the node reads what that topic takes in the background (`TopicCatalog.takes`)
when a decision first writes to it; the retake decides the command again and refuses it
as too large (answered ERROR, dead-lettered), and the partition goes on. Before, the topic
was taken to take what one of the broker's defaults does, and the partition failed on the
same command for good. A topic this node's principal may not write (no Write ACL) is
marked so by the failure (`TopicCatalog.writes_refused`), and the retake answers the
command ERROR alike; before, the partition failed on it for good."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from fakes import T0, FakeClock, RunningNode, running, wait_until
from pydantic import BaseModel
from test_node_topic_limits import answered, letters, owners, refusing, results

from app.errors import KafkaUnavailable
from app.kafka import OutRecord, TopicSpec
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, encode
from app.service import Service
from tables import AggregateRef
from tables.partitioner import partition_of

P = 2
T = AggregateTopics("big", "thing")
OTHER = AggregateTopics("other", "desk")


class S(BaseModel):
    n: int = 0


thing = AggregateType("big", "thing", S)


@thing.command("Forward")
def _forward(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Forwarded", {})
    desk = AggregateRef(context="other", aggregate="desk", id="d1")
    d.send(desk, "Take", {"pad": "z" * int(cmd.body["size"])})


@thing.command("Note")
def _note(state: S, cmd: Command, d: Decision) -> None:
    d.emit("Forwarded", {})


@thing.applies("Forwarded")
def _forwarded(state: S, e: Any) -> S:
    return state.model_copy(update={"n": state.n + 1})


async def _send(log: MemoryLog, owner: str, size: int, type_: str = "Forward") -> str:
    cmd = CommandEnvelope(
        request_id=uuid.uuid4().hex,
        type=type_,
        aggregate=AggregateRef(context="big", aggregate="thing", id=owner),
        body={"size": size},
        issued_at=int(time.time() * 1000),
    )
    await log.publisher().send(T.commands, owner.encode(), encode(cmd), partition_of(owner, P))
    return cmd.request_id


async def test_a_command_over_another_contexts_smaller_topic_fails_one_commit_then_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MemoryLog()
    log.ensure_topics([TopicSpec(OTHER.commands, P, max_message_bytes=64 * 1024)])
    refused = refusing(log, monkeypatch)
    service = Service(aggregates=(thing,))
    big_owner, small_owner = owners(2)
    node = RunningNode(log, tmp_path, "a", service, P, clock=FakeClock(T0))
    async with running(node):
        big = await _send(log, big_owner, 100_000)
        small = await _send(log, small_owner, 10)
        got = await answered(log, big, small)
        assert got[big].code == "ERROR" and OTHER.commands in (got[big].message or "")
        assert "over 65024" in (got[big].message or "")
        assert got[small].code == "COMMITTED"
        [letter] = letters(log)
        assert letter.topic == T.commands and letter.context.stage == "decide"
        # Refused by the broker only until the limit was read: one commit, as a rule.
        assert set(refused) == {OTHER.commands}
        assert [r.request_id for r in results(log).values()].count(big) == 1
        await wait_until(lambda: node.node.health().get("failing") in (None, {}))
        # Nothing over the limit reached the topic.
        assert all(
            len(r.value or b"") < 64 * 1024
            for p in range(P)
            for r in log.records(OTHER.commands, p)
        )


async def test_a_command_to_a_topic_this_node_may_not_write_fails_one_commit_then_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = MemoryLog()
    log.ensure_topics([TopicSpec(OTHER.commands, P)])
    refused: list[str] = []
    append = log._append

    def no_acl(records: list[OutRecord], txn: Any) -> list[int]:
        if txn is not None and any(r[0] == OTHER.commands for r in records):
            refused.append(OTHER.commands)
            denied = TopicAuthorizationFailedError({OTHER.commands})
            raise KafkaUnavailable("produce refused") from denied
        return append(records, txn)

    monkeypatch.setattr(log, "_append", no_acl)
    big_owner, small_owner = owners(2)
    node = RunningNode(log, tmp_path, "a", Service(aggregates=(thing,)), P, clock=FakeClock(T0))
    async with running(node):
        denied = await _send(log, big_owner, 10)
        small = await _send(log, small_owner, 10, "Note")
        got = await answered(log, denied, small)
        assert got[denied].code == "ERROR"
        assert f"topic {OTHER.commands} refused this node's writes" in (got[denied].message or "")
        assert got[small].code == "COMMITTED"
        assert refused == [OTHER.commands]  # the retake wrote nothing to it
        [letter] = letters(log)
        assert letter.topic == T.commands and letter.context.stage == "decide"
        await wait_until(lambda: node.node.health().get("failing") in (None, {}))
