"""A static group member's rejoin (KIP-345, `TICKWHEEL_GROUP_INSTANCE_ID`): aiokafka's
coordinator state read and set between its reset and its next JoinGroup, so that a worker
whose instance id another took since is fenced (FENCED_INSTANCE_ID) rather than take it
back. May import `aiokafka` alone."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer

__all__ = ["Membership", "rejoin_as"]


def rejoin_as(member_id: str, last: str | None) -> str | None:
    """The member id a static member rejoins as: its last one when the coordinator's
    answer reset it (`member_id` empty), else None (it joins as it is).

    aiokafka's heartbeat names no `group.instance.id`, so a static member whose id another
    worker joined with since hears only "unknown member", resets, and joins afresh, taking
    the id back: the two would fence each other at every heartbeat, quietly, both running
    the partitions. Joining as the member it was, the coordinator answers it
    FENCED_INSTANCE_ID when another holds its instance id now (it stops, the other goes
    on), or "unknown member" when its session merely expired (it then joins afresh)."""
    return last if not member_id and last else None


class Membership:
    """A static member's last member id, and the rejoin as it (`rejoin_as`): aiokafka's
    coordinator state, read and set between its reset and its next JoinGroup (the revoke
    callback runs there). Nothing for a dynamic member."""

    def __init__(self, consumer: AIOKafkaConsumer, static: bool) -> None:
        self._consumer = consumer
        self._static = static
        self._last: str | None = None

    def _coordinator(self) -> Any:
        return getattr(self._consumer, "_coordinator", None) if self._static else None

    def joined(self) -> None:
        coordinator = self._coordinator()
        if coordinator is not None:
            self._last = getattr(coordinator, "member_id", None) or self._last

    def rejoining(self) -> None:
        coordinator = self._coordinator()
        if coordinator is None:
            return
        member = rejoin_as(getattr(coordinator, "member_id", ""), self._last)
        if member is not None:
            coordinator.member_id = member
