"""An event another writer's producer appends twice (sent again after a lost
acknowledgement: the same event id, adjacent in the log) folds once, live and in a
restore alike (`app.commands.folds`).

The second copy is at the aggregate's version, under the request id folded last, at a
later offset: the rule took it for the next event of that decision and folded it again
(without a request id too: its mark is its own id). The aggregate counted it twice, and
every decision after ran on that state."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import orjson
import pytest
from fakes import T0, OneBatchLog
from test_fold_rule import EVENTS, ORDER, Commits, P, processor, remind_cmd

from app.commands.folds import EVENTS_MAX, Mark, continues, marked
from app.commands.processor import state_key
from app.kafka import Record
from app.protocol.wire import EventEnvelope, encode


def ev(event_id: str, version: int, request_id: str | None) -> EventEnvelope:
    return EventEnvelope(
        id=event_id,
        type="shop.Reminded",
        aggregate=ORDER,
        version=version,
        request_id=request_id,
        created_at=T0,
        body={},
    )


class OneByOne(OneBatchLog):
    """The log read one record a batch: the mark of the request folded last carries over
    from one batch of the restore to the next."""

    async def read(
        self, topic: str, partition: int, start: int
    ) -> AsyncGenerator[list[Record], None]:
        for r in self.records:
            if r.offset >= start:
                yield [r]


async def live_and_restored(
    theirs: list[EventEnvelope], *, batches: bool, one_by_one: bool
) -> tuple[object, object, list[bool]]:
    """`theirs` followed live (in one batch, or one batch each when `batches`), and a
    fresh copy restoring the same log: the aggregate as each keeps it, and what the
    follow said of each event."""
    live, live_store = processor(Commits())
    followed = []
    batch = live.begin()
    for offset, e in enumerate(theirs):
        followed.append(live.follow(batch, e, offset))
        if batches:
            live.staged(batch)
            live.committed(batch, [])
            batch = live.begin()
    live.staged(batch)
    live.committed(batch, [])
    log = [Record(EVENTS, P, i, ORDER.id.encode(), encode(e), T0, ()) for i, e in enumerate(theirs)]
    fresh, fresh_store = processor(Commits())
    await fresh.restore(OneByOne(log) if one_by_one else OneBatchLog(log))
    aid = state_key(ORDER)
    return (
        orjson.loads(live_store.get(P, aid) or b"null"),
        orjson.loads(fresh_store.get(P, aid) or b"null"),
        followed,
    )


@pytest.mark.parametrize("request_id", ["w-1", None], ids=["request-id", "no-request-id"])
@pytest.mark.parametrize("batches", [False, True], ids=["one-batch", "next-batch"])
async def test_an_event_appended_twice_folds_once(request_id: str | None, batches: bool) -> None:
    theirs = [ev("e-1", 1, request_id), ev("e-1", 1, request_id)]
    live, restored, followed = await live_and_restored(theirs, batches=batches, one_by_one=batches)
    assert followed == [True, False]
    assert live == {"version": 1, "deleted": False, "state": {"reminded": 1}}
    assert restored == live


async def test_a_decision_appended_twice_folds_once() -> None:
    # The writer's whole batch sent again: both events of its decision, twice.
    theirs = [ev(f"e-{i}", 1, "w-1") for i in (1, 2, 1, 2)]
    live, restored, followed = await live_and_restored(theirs, batches=False, one_by_one=True)
    assert followed == [True, True, False, False]
    assert live == {"version": 1, "deleted": False, "state": {"reminded": 2}}
    assert restored == live


async def test_the_decision_goes_on_after_an_event_appended_twice() -> None:
    # The first event sent again before the second: the decision's second one still folds.
    theirs = [ev("e-1", 1, "w-1"), ev("e-1", 1, "w-1"), ev("e-2", 1, "w-1")]
    live, restored, followed = await live_and_restored(theirs, batches=True, one_by_one=False)
    assert followed == [True, False, True]
    assert live == {"version": 1, "deleted": False, "state": {"reminded": 2}}
    assert restored == live


async def test_a_decision_after_runs_on_the_state_folded_once() -> None:
    commits = Commits()
    live, live_store = processor(commits)
    batch = live.begin()
    assert [live.follow(batch, ev("e-1", 1, "w-1"), o) for o in (0, 1)] == [True, False]
    live.staged(batch)
    live.committed(batch, [])
    await live.handle([], local=[remind_cmd("r-1")])
    assert orjson.loads(live_store.get(P, state_key(ORDER)) or b"") == {
        "version": 2,
        "deleted": False,
        "state": {"reminded": 2},
    }


def test_the_mark_keeps_the_latest_event_ids_of_its_decision() -> None:
    mark = marked(None, "r", 1, "e-1", 1)
    assert mark == Mark("r", 1, ("e-1",), 1)
    assert continues(mark, "r", 2, "e-2", 1)
    assert not continues(mark, "r", 2, "e-1", 1)  # the same event again
    # The same ids at another version: the request decided again (sent again once the
    # window forgot it), not a retried append; its mark starts afresh.
    assert continues(mark, "r", 2, "e-1", 2)
    assert marked(mark, "r", 2, "e-1", 2) == Mark("r", 2, ("e-1",), 2)
    mark = marked(mark, "r", 2, "e-2", 1)
    assert mark == Mark("r", 2, ("e-1", "e-2"), 1)
    assert marked(mark, "s", 3, "e-3", 1) == Mark("s", 3, ("e-3",), 1)  # another request
    for i in range(3, 3 + EVENTS_MAX):
        mark = marked(mark, "r", i, f"e-{i}", 1)
    assert len(mark.events) == EVENTS_MAX  # bounded: the first ones let go
    assert mark.events[-1] == f"e-{2 + EVENTS_MAX}"
    assert continues(mark, "r", 3 + EVENTS_MAX, "e-1", 1)
