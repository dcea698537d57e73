"""A `timers` changelog's `max.message.bytes` lowered while the node runs, under a stored
timer whose row it takes no more. The node reads what the topic takes again every 30 s
(`TopicCatalog.takes`); until then the broker refuses the partition's transactions that
hold the row (modelled by `refusing`), after it the partition's sink refuses the row, and
the retake dead-letters and deletes it (`app.node.row_limit`): the partition goes on. Its
set event, read again by the retake (the node did not wait for its read-back's commit),
is dead-lettered as too large for the changelog now, not stored again. Before, the
partition failed at every retake until the node was restarted."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import T0, FakeClock, RunningNode, running, wait_until
from test_node_topic_limits import (
    SERVICE,
    P,
    T,
    answered,
    letters,
    owners,
    refusing,
    send,
    timer_keys,
    timers,
)

from app.kafka.memory import MemoryLog
from app.protocol.dead_letters import DeadLetter
from tables import Timer


async def test_a_changelog_lowered_while_the_node_runs_letters_the_row_it_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, clock = MemoryLog(), FakeClock(T0)
    refused = refusing(log, monkeypatch)
    big_owner, small_owner = owners(2)
    at = T0 + 60_000
    node = RunningNode(log, tmp_path, "a", SERVICE, P, clock=clock)
    async with running(node):
        rid = await send(log, big_owner, "Later", size=40_000, at=at)
        assert (await answered(log, rid))[rid].code == "COMMITTED"
        await wait_until(lambda: (big_owner, "k") in timer_keys(log, 0))
        [stored] = timers(log, 0)
        log._max_bytes[T.timers_changelog] = 16 * 1024  # an operator lowers it
        clock.set(at)  # past the last read's 30 s, and the timer due
        await wait_until(lambda: _of(letters(log), T.timers_changelog) != [], within=20)
        small = await send(log, small_owner, "Grow", size=10)
        assert (await answered(log, small))[small].code == "COMMITTED"
        [letter] = _of(letters(log), T.timers_changelog)
        assert letter.value is not None and Timer.model_validate_json(letter.value) == stored
        # The set read again, if it was: refused at once, never stored (no second row).
        sets = _of(letters(log), T.events)
        assert len(sets) <= 1 and all(s.context.stage == "apply" for s in sets)
        assert len(letters(log)) == 1 + len(sets)
        assert set(refused) <= {T.timers_changelog}
        await wait_until(lambda: node.node.health().get("failing") in (None, {}))


def _of(found: list[DeadLetter], topic: str) -> list[DeadLetter]:
    return [letter for letter in found if letter.topic == topic]
