"""The poll loop's offset commits to the group failing again and again while the polls
between them pass (a coordinator away: each commit gives up after `GROUP_CALL_S`): the
node stops, loudly, after `COMMITS_FAILING_S` of them, none landing, as it does for polls
that keep failing (after `POLL_FAILING_S`). Before, each poll that passed ended the
failing, and the node sat not ready (its commit lag) for ever. A commit landing, or a
round with nothing to commit (nothing waits for the group: no lag either), ends it."""

from __future__ import annotations

import asyncio
from typing import Any, Literal, cast

import pytest
from fakes import wait_until

from app.errors import KafkaUnavailable
from app.kafka.group_consumer import GROUP_CALL_S
from app.kafka.ports import GroupMember
from app.node import polling
from app.node.polling import COMMITS_FAILING_S, poll_loop

Outcome = Literal["hangs", "lands", "quiet"]
"""A round's commit: given up after `GROUP_CALL_S`, landed, or none (nothing to commit)."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Group:
    """A group member whose polls pass, nothing to read, and whose offset commits go as
    `rounds` says, one a round, then hang (the adapter's deadline, on `clock`); the
    commit after the `last` never ends (the test has seen enough)."""

    def __init__(self, clock: Clock, rounds: list[Outcome], last: int) -> None:
        self.clock = clock
        self.rounds = rounds
        self.last = last
        self.polls = 0
        self.commits = 0  # those with offsets, begun (the one past the last not counted)
        self.past_the_last = asyncio.Event()

    def assignment(self) -> set[tuple[str, int]]:
        return set()

    async def poll(self, timeout_ms: int = 500) -> dict[tuple[str, int], list[Any]]:
        self.polls += 1
        await asyncio.sleep(0)
        return {}

    async def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        if not offsets:
            return
        if self.commits == self.last:
            self.past_the_last.set()
            await asyncio.Event().wait()
        self.commits += 1
        if self.next() == "hangs":
            self.clock.now += GROUP_CALL_S
            raise KafkaUnavailable(f"no offset commit within {GROUP_CALL_S:g} s")
        self.clock.now += 0.01

    def next(self) -> Outcome:
        return self.rounds.pop(0) if self.rounds else "hangs"


class Offsets:
    """The offsets done each round: one partition's, unless the group's next round is
    "quiet" (an hour with nothing read)."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.offset = 0

    def take_offsets(self) -> dict[tuple[str, int], int]:
        if self.group.rounds[:1] == ["quiet"]:
            self.group.rounds.pop(0)
            self.group.clock.now += 3600
            return {}
        self.offset += 1
        return {("shop.order.events", 2): self.offset}

    def offsets_landed(self) -> None:
        pass

    def offsets_ended(self) -> None:
        pass


async def _run(rounds: list[Outcome], last: int) -> tuple[Group, list[str]]:
    """The loop over `rounds`, until it ends or `last` commits were done."""
    clock = Clock()
    group, failed = Group(clock, rounds, last), list[str]()
    loop = asyncio.create_task(
        poll_loop(cast(GroupMember, group), {}, Offsets(group), failed.append, {}, clock=clock)
    )
    try:
        await wait_until(lambda: loop.done() or group.past_the_last.is_set())
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    return group, failed


@pytest.fixture(autouse=True)
def _no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(polling, "POLL_RETRY_S", 0.0)


async def test_commits_failing_for_good_stop_the_node_whatever_the_polls_between() -> None:
    assert COMMITS_FAILING_S == 10 * GROUP_CALL_S  # ten commits given up in a row
    group, failed = await _run([], last=40)
    assert group.commits == 10 and group.polls == 10
    assert failed == [
        f"the group consumer's offset commits failed for {COMMITS_FAILING_S:.0f} s, none "
        f"passing: no offset commit within {GROUP_CALL_S:g} s"
    ]


async def test_a_commit_landing_between_ends_the_failing() -> None:
    # Five given up, 150 s of them, none in a row; then ten in a row stop it.
    group, failed = await _run(["hangs", "lands"] * 5, last=40)
    assert group.commits == 20 and len(failed) == 1


async def test_commits_failing_far_apart_are_not_in_a_row() -> None:
    """A quiet node's commits fail once in a while (a rebalance each), nothing to commit in
    between: nothing waited for the group meanwhile, so they never add up."""
    group, failed = await _run(["hangs", "quiet"] * 5, last=40)
    assert group.commits == 15 and len(failed) == 1
