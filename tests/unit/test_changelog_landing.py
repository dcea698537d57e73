"""A commit's rows landing, told the partition's copy (`partition_open._landing`): an
offset at or before the copy's is a changelog made again under the node only when the
changelog now ends there too. aiokafka tells -1 and up for a batch the broker had taken
already (DUPLICATE_SEQUENCE_NUMBER): read as a loss, it stopped the partition until a
rebuild of every worker's, on a healthy cluster. And a restore cancelled in its last
flush says its copy is not known (a take cut short there must not mark it clean)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from app.node.partition_open import _landing
from app.node.partition_transaction import ChangelogBehind
from app.timers.restore import restore_partition


class _Copy:
    partition = 3

    def __init__(self, held: int | None) -> None:
        self.held = held
        self.told: list[int] = []

    def changelog_offset(self) -> int | None:
        return self.held

    async def applied_through(self, offset: int) -> None:
        self.told.append(offset)


class _Marks:
    def __init__(self) -> None:
        self.lost: list[tuple[int, str, int]] = []

    def note_lost(self, partition: int, why: str, end: int) -> None:
        self.lost.append((partition, why, end))


class _Reader:
    def __init__(self, end: int) -> None:
        self.end = end

    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, self.end


def _landed(copy: _Copy, marks: _Marks, end: int) -> Any:
    return _landing(cast(Any, copy), cast(Any, marks), cast(Any, _Reader(end)), "c.timers")


@pytest.mark.parametrize("said", [-1, 0, 5, 100])
async def test_an_offset_said_wrong_on_an_intact_changelog_is_passed_over(said: int) -> None:
    copy, marks = _Copy(held=100), _Marks()
    await _landed(copy, marks, end=104)(said)  # its rows at 102, their marker at 103
    assert marks.lost == [] and copy.told == []  # the copy's offset never goes back


@pytest.mark.parametrize(("said", "end"), [(4, 6), (100, 102), (0, 2)])
async def test_a_changelog_ending_just_past_the_commit_is_a_loss_noted(said: int, end: int) -> None:
    copy, marks = _Copy(held=100), _Marks()
    with pytest.raises(ChangelogBehind, match=rf"c.timers\[3\] took .* at offset {said} and ends"):
        await _landed(copy, marks, end=end)(said)
    assert [(p, at) for p, _, at in marks.lost] == [(3, end)] and copy.told == []


@pytest.mark.parametrize("held", [None, 99])
async def test_an_offset_past_the_copy_is_told_it(held: int | None) -> None:
    copy, marks = _Copy(held=held), _Marks()
    await _landed(copy, marks, end=0)(120)  # the end is not read
    assert copy.told == [120] and marks.lost == []


# --- a restore cancelled at its end --------------------------------------------------------


class _EndsSlowly:
    """A store of one partition at nothing applied, whose `end_restore` (the flush of what
    the restore wrote without the WAL) never ends."""

    def changelog_offset(self, partition: int) -> int | None:
        return None

    async def drop(self, partition: int) -> None: ...

    async def assign(self, partitions: object) -> None: ...

    async def end_restore(self, partition: int) -> None:
        await asyncio.Event().wait()


class _Empty:
    async def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, 0

    async def read(self, topic: str, partition: int, start: int) -> Any:
        return
        yield


async def test_a_restore_cancelled_in_its_flush_says_its_copy_is_not_known() -> None:
    # Its flush runs on in its thread while the close flushes and closes the DB: the copy
    # must not be marked clean by a take cut short there.
    told: list[bool] = []
    restoring = asyncio.create_task(
        restore_partition(
            cast(Any, _EndsSlowly()),
            cast(Any, _Empty()),
            "c.timers",
            0,
            clean=False,
            committed_only=told.append,
        )
    )
    await asyncio.sleep(0.01)
    restoring.cancel()
    with pytest.raises(asyncio.CancelledError):
        await restoring
    assert told[-1] is False, told
