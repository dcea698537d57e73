"""Static group membership (KIP-345, `TICKWHEEL_GROUP_INSTANCE_ID`): the setting, the group
consumer's options, the rejoin of a static member as the member it was (so that the
coordinator fences a duplicate instead of the two taking the id from each other at every
heartbeat), and the fence turned into a loud stop naming the setting. The restart on a real
broker: `tests/integration/test_static_membership_kafka.py`."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka.errors import KafkaError, UnknownMemberIdError, for_code
from fakes_fetch import unwatched
from fakes_poll import NoOffsets

from app.errors import ConfigError, KafkaUnavailable
from app.kafka.group_consumer import GroupConsumer, _Listener
from app.kafka.ports import GroupMember
from app.kafka.read_positions import ReadPositions
from app.kafka.records import FencedInstanceIdCode, instance_fenced
from app.kafka.refused_topics import RefusedTopics
from app.kafka.static_membership import Membership, rejoin_as
from app.node.polling import poll_loop
from app.node.settings import Settings

# What aiokafka raises from a JoinGroup (or SyncGroup, heartbeat) answered
# FENCED_INSTANCE_ID: a bare KafkaError holding the error's repr.
AS_AIOKAFKA_RAISES = KafkaError(repr(FencedInstanceIdCode()))


def test_the_setting_is_unset_by_default_and_read_from_its_variable() -> None:
    assert Settings.from_env({}).group_instance_id is None
    given = Settings.from_env({"TICKWHEEL_GROUP_INSTANCE_ID": "timers-0"})
    assert given.group_instance_id == "timers-0"
    # Empty, as every optional setting's: unset (a dynamic member).
    assert Settings.from_env({"TICKWHEEL_GROUP_INSTANCE_ID": ""}).group_instance_id is None


@pytest.mark.parametrize("value", ["a b", "a\x00b", "x" * 201])
def test_a_bad_instance_id_names_its_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="TICKWHEEL_GROUP_INSTANCE_ID"):
        Settings.from_env({"TICKWHEEL_GROUP_INSTANCE_ID": value})


async def nothing(_: set[tuple[str, int]]) -> None:
    pass


@pytest.mark.parametrize("instance", [None, "timers-0"])
async def test_the_group_consumer_is_given_the_instance_id(instance: str | None) -> None:
    group = GroupConsumer(
        "127.0.0.1:9092",
        "g",
        ["t"],
        on_assigned=nothing,
        on_revoked=nothing,
        group_instance_id=instance,
    )
    try:
        assert group._consumer._group_instance_id == instance
    finally:
        await group.stop()


@pytest.mark.parametrize(
    ("member", "last", "rejoins_as"),
    [
        ("", "timers-0-1f2e", "timers-0-1f2e"),  # reset by the coordinator's answer
        ("timers-0-1f2e", "timers-0-1f2e", None),  # a rebalance: it rejoins as it is
        ("", None, None),  # its first join
    ],
)
def test_a_static_member_reset_rejoins_as_the_member_it_was(
    member: str, last: str | None, rejoins_as: str | None
) -> None:
    assert rejoin_as(member, last) == rejoins_as


def listener(coordinator: Any, *, static: bool) -> _Listener:
    consumer = SimpleNamespace(_coordinator=coordinator)
    membership = Membership(cast(Any, consumer), static=static)
    return _Listener(nothing, nothing, lambda _: None, membership)


async def test_the_revoke_before_a_rejoin_gives_a_reset_static_member_its_last_id() -> None:
    coordinator = SimpleNamespace(member_id="timers-0-1f2e")
    callbacks = listener(coordinator, static=True)
    await callbacks.on_partitions_assigned(set())
    coordinator.member_id = ""  # aiokafka's heartbeat heard "unknown member"
    await callbacks.on_partitions_revoked(set())
    assert coordinator.member_id == "timers-0-1f2e"


async def test_a_dynamic_member_reset_joins_afresh() -> None:
    coordinator = SimpleNamespace(member_id="consumer-1-9a8b")
    callbacks = listener(coordinator, static=False)
    await callbacks.on_partitions_assigned(set())
    coordinator.member_id = ""
    await callbacks.on_partitions_revoked(set())
    assert coordinator.member_id == ""


def test_fenced_instance_id_is_known_and_seen_through_aiokafkas_wrapping() -> None:
    assert for_code(82) is FencedInstanceIdCode
    assert instance_fenced(FencedInstanceIdCode())
    assert instance_fenced(AS_AIOKAFKA_RAISES)
    wrapped = KafkaUnavailable("poll failed")
    wrapped.__cause__ = AS_AIOKAFKA_RAISES
    assert instance_fenced(wrapped)
    assert not instance_fenced(KafkaError(repr(UnknownMemberIdError())))
    assert not instance_fenced(None)


class FencedConsumer:
    """aiokafka's consumer whose coordinator was answered FENCED_INSTANCE_ID."""

    _fetcher = None
    _client = None

    async def getmany(self, timeout_ms: int = 0) -> dict[Any, Any]:
        raise AS_AIOKAFKA_RAISES

    def assignment(self) -> set[Any]:
        return set()


async def test_a_fenced_poll_names_the_setting_and_the_id() -> None:
    group = GroupConsumer.__new__(GroupConsumer)
    group._consumer = cast(Any, FencedConsumer())
    group._topics, group._group_id, group._instance_id = ["t"], "shop", "timers-0"
    group._read, group._refused, group._watch = ReadPositions(), RefusedTopics(), unwatched()
    with pytest.raises(KafkaUnavailable, match=r"TICKWHEEL_GROUP_INSTANCE_ID \('timers-0'\)") as e:
        await group.poll()
    assert instance_fenced(e.value)


class FencedMember:
    def __init__(self) -> None:
        self.polls = 0

    def assignment(self) -> set[tuple[str, int]]:
        return set()

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Any]]:
        self.polls += 1
        raise KafkaUnavailable("fenced out of group 'shop'") from AS_AIOKAFKA_RAISES


async def test_the_node_stops_at_the_first_fenced_poll_never_retrying() -> None:
    member, failed = FencedMember(), list[str]()
    await asyncio.wait_for(
        poll_loop(cast(GroupMember, member), {}, NoOffsets(), failed.append, {}), 2
    )
    [why] = failed
    assert "fenced" in why and member.polls == 1
