"""`group_members` reads each group's error code in the DescribeGroups answer (aiokafka
raises none of them): a refused or coordinator-less group was counted as 0 members, and a
rebuild went on under running workers. Faked at aiokafka's admin client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from app.errors import KafkaUnavailable
from app.kafka import group_members
from app.kafka.records import refused

GROUP = "tickwheel-shop"
OK, LOADING, NOT_FOUND, GROUP_DENIED = 0, 14, 69, 30


@dataclass
class _Described:
    groups: list[tuple[Any, ...]]


class _Admin:
    """An admin client whose DescribeGroups answers `codes` in turn (the last one again),
    the group with two members when it answers no error."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.asked = 0

    def __call__(self, **options: object) -> _Admin:
        return self

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def describe_consumer_groups(self, group_ids: list[str]) -> list[_Described]:
        code = self.codes[min(self.asked, len(self.codes) - 1)]
        self.asked += 1
        members = [] if code else [("m1",), ("m2",)]
        return [
            _Described(
                [(code, g, "Stable" if not code else "", "", "", members) for g in group_ids]
            )
        ]


async def test_a_group_refused_is_an_error_saying_so_not_zero_members(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = _Admin(GROUP_DENIED)
    monkeypatch.setattr("app.kafka.group_admin.AIOKafkaAdminClient", admin)
    with pytest.raises(KafkaUnavailable, match=f"cannot describe group {GROUP}: not authorized"):
        await group_members("127.0.0.1:9092", GROUP)
    assert admin.asked == 1  # no retry passes an ACL


async def test_a_refusal_is_told_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.kafka.group_admin.AIOKafkaAdminClient", _Admin(GROUP_DENIED))
    with pytest.raises(KafkaUnavailable) as caught:
        await group_members("127.0.0.1:9092", GROUP)
    assert refused(caught.value)


async def test_a_coordinator_loading_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = _Admin(LOADING, OK)
    monkeypatch.setattr("app.kafka.group_admin.AIOKafkaAdminClient", admin)
    assert await group_members("127.0.0.1:9092", GROUP) == 2
    assert admin.asked == 2


async def test_a_group_that_does_not_exist_has_no_member(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.kafka.group_admin.AIOKafkaAdminClient", _Admin(NOT_FOUND))
    assert await group_members("127.0.0.1:9092", GROUP) == 0
