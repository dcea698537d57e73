"""A request id a caller reuses for another timer change (`app.clients.book_commands.
scoped_request_id`): over the web edge a DELETE under the id of an earlier PUT cancels, and
a PUT of another key under a used id sets it (both were answered DUPLICATE, nothing done).
The same change sent again is still its DUPLICATE, the answer names the id as the caller
gave it, and an id an answer named (a hashed one too) sent again is the same change.

The node and its web edge are `test_timer_api`'s fixtures, imported (hence F811)."""

from __future__ import annotations

from typing import Any

from fakes import T0
from hypothesis import given
from hypothesis import strategies as st
from test_timer_api import (  # noqa: F401
    BOOK,
    Edge,
    edge,
    events,
    put_body,
    rows,
    until,
)

from app.clients.book_commands import scoped_request_id, unscoped_request_id
from app.model.aggregate import MAX_TRIGGER_REQUEST_ID
from app.protocol.wire import MAX_REQUEST_ID
from tables import TimerStatus

PATH = "/timers/shop.reminders/o-1"


def status_of(edge: Edge, key: str) -> TimerStatus:  # noqa: F811
    (found,) = [t.status for t in rows(edge.log) if t.key == key]
    return found


async def change(edge: Edge, method: str, key: str, rid: str, **body: Any) -> tuple[int, Any]:  # noqa: F811
    if method == "PUT":
        return await edge.call("PUT", f"{PATH}/{key}", put_body(T0 + 60_000, request_id=rid))
    path = f"{PATH}/{key}" if method == "DELETE" else f"{PATH}/{key}/{method}"
    verb = "DELETE" if method == "DELETE" else "POST"
    return await edge.call(verb, path, headers={"Idempotency-Key": rid})


async def test_an_id_reused_for_another_change_is_that_changes_own(edge: Edge) -> None:  # noqa: F811
    set_a = await change(edge, "PUT", "a", "x-1")
    assert set_a[0] == 200 and (set_a[1]["code"], set_a[1]["request_id"]) == ("COMMITTED", "x-1")
    # The cancel under the set's id cancels (it was a DUPLICATE: the timer stayed and fired).
    cancel_a = await change(edge, "DELETE", "a", "x-1")
    assert (cancel_a[1]["code"], cancel_a[1]["request_id"]) == ("COMMITTED", "x-1"), cancel_a
    await until(lambda: status_of(edge, "a") is TimerStatus.CANCELLED)
    # Another key under it is set (it was a DUPLICATE: nothing set).
    set_b = await change(edge, "PUT", "b", "x-1")
    assert set_b[1]["code"] == "COMMITTED", set_b
    await until(lambda: status_of(edge, "b") is TimerStatus.PENDING)
    assert (await change(edge, "pause", "b", "x-1"))[1]["code"] == "COMMITTED"
    await until(lambda: status_of(edge, "b") is TimerStatus.PAUSED)
    # Each change sent again is its own DUPLICATE, nothing written.
    for method, key in [("PUT", "a"), ("DELETE", "a"), ("PUT", "b"), ("pause", "b")]:
        again = await change(edge, method, key, "x-1")
        assert again[0] == 200 and again[1]["code"] == "DUPLICATE", (method, key, again)
        assert again[1]["request_id"] == "x-1"
    assert len(events(edge.log, BOOK, "wow.ScheduleSet")) == 2
    assert status_of(edge, "b") is TimerStatus.PAUSED


async def test_an_id_an_answer_named_sent_again_is_the_same_change(edge: Edge) -> None:  # noqa: F811
    # Scoped as the book writes it (a client that kept what was sent): the same change.
    assert (await change(edge, "PUT", "c", "y-1"))[1]["code"] == "COMMITTED"
    written = scoped_request_id("set", "c", "y-1")
    assert (await change(edge, "PUT", "c", written))[1]["code"] == "DUPLICATE"
    # Too long to scope whole: hashed, named so, and sent again as named it is the same.
    long_id = "z" * MAX_REQUEST_ID
    first = await change(edge, "PUT", "d", long_id)
    assert first[1]["code"] == "COMMITTED" and first[1]["request_id"].startswith("sha256:")
    again = await change(edge, "PUT", "d", first[1]["request_id"])
    assert again[1]["code"] == "DUPLICATE", again
    assert (await change(edge, "PUT", "d", long_id))[1]["code"] == "DUPLICATE"
    over = await change(edge, "DELETE", "d", "z" * (MAX_REQUEST_ID + 1))
    assert (over[0], over[1]["field"]) == (400, "request_id"), over


@given(
    op=st.sampled_from(["set", "cancel", "pause", "resume", "trigger"]),
    timer=st.text(min_size=1, max_size=200),
    other=st.text(min_size=1, max_size=200),
    rid=st.text(min_size=1, max_size=MAX_TRIGGER_REQUEST_ID),
)
def test_a_scoped_id_fits_names_its_change_and_comes_back(
    op: str, timer: str, other: str, rid: str
) -> None:
    scoped = scoped_request_id(op, timer, rid)
    limit = MAX_TRIGGER_REQUEST_ID if op == "trigger" else MAX_REQUEST_ID
    assert len(scoped) <= limit
    # The id an answer names, given again (or the written one), is the same change.
    assert scoped_request_id(op, timer, unscoped_request_id(scoped)) == scoped
    assert scoped_request_id(op, timer, scoped) == scoped
    # An id begun with its scope twice, or the scope alone (made by hand: a written id
    # pasted back), is scoped again, so that the id its answer names is it too.
    prefix = scoped[: scoped.index(":", scoped.index(":") + 1) + 1]
    for odd in (prefix, prefix + prefix + "x"):
        made = scoped_request_id(op, timer, odd)
        assert scoped_request_id(op, timer, unscoped_request_id(made)) == made
        assert unscoped_request_id(made) == odd or len(prefix + odd) > limit
    # Another timer's, or another action's, is another.
    if other != timer:
        assert scoped_request_id(op, other, rid) != scoped
    assert scoped_request_id("set" if op != "set" else "cancel", timer, rid) != scoped
