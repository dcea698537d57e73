"""Pause, resume and trigger-now of one timer through a timer book (`POST /timers/{type}/
{owner}/{key}/pause|resume|trigger`, `tickwheel timers pause|resume|trigger`), on a whole
node on the in-memory log with a fake clock: a paused timer never fires while time passes;
its resume fires by the rule's catch-up policy; a trigger fires once, even sent again;
no-ops are answered UNCHANGED, a key the book has no timer under 404, a finished one 409;
and the log replayed into an empty table (a rebuild) holds the same paused row.

The node, its web edge and the command line's fake broker are `test_timer_api`'s fixtures,
imported (hence F811: a test's argument named as the fixture it takes)."""

# ruff: noqa: F811

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from fakes import T0, sent_base
from test_timer_api import (  # noqa: F401
    ANSWERS,
    BOOK,
    PINGS,
    TOKEN,
    Edge,
    edge,
    events,
    rows,
    sent,
    until,
)
from typer.testing import CliRunner
from yarl import URL

import app.cli.timer_changes
import app.ops.timer_routes
from app.cli import cli
from app.clients.book_commands import scoped_request_id
from app.clients.timer_book import BOOK_RETENTION, SET_TIMER, timer_book
from app.model.aggregate import sent_request_id
from app.model.decide import decide
from app.ops.timer_routes import TimerRoutes
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    ResultCode,
    decode,
)
from app.timers.subscription import apply_all, timer_op
from tables import AggregateRef, Timer, TimerStatus
from tables.memory_store import MemoryTimerStore

PATH = "/timers/shop.reminders/o-1"
SERVICE_BOOK = timer_book("shop", "reminders")  # as the node's (`SERVICE`)


def interval(start: int, every: int, note: str, **rule: Any) -> dict[str, Any]:
    return {
        "rule": {"kind": "interval", "start": start, "every": every, **rule},
        "target": {"type": "shop.order", "id": "p-1"},
        "command": {"type": "RemindToPay", "body": {"note": note}},
    }


def once(at: int, note: str) -> dict[str, Any]:
    return {
        "rule": {"kind": "once", "at": at},
        "target": {"type": "shop.order", "id": "p-1"},
        "command": {"type": "RemindToPay", "body": {"note": note}},
    }


def pings(edge: Edge, note: str) -> list[EventEnvelope]:
    return [e for e in events(edge.log, PINGS, "Pinged") if e.body["note"] == note]


def row(edge: Edge, key: str) -> Timer:
    (found,) = [t for t in rows(edge.log) if t.key == key]
    return found


async def act(edge: Edge, key: str, action: str, request_id: str) -> tuple[int, Any]:
    return await edge.call(
        "POST", f"{PATH}/{key}/{action}", headers={"Idempotency-Key": request_id}
    )


async def test_a_paused_timer_never_fires_and_its_resume_catches_up(edge: Edge) -> None:
    # Every 10 s from T0 + 1 s, coalescing (the default): slot 0 fires first.
    assert (await edge.call("PUT", f"{PATH}/tick", interval(T0 + 1_000, 10_000, "tick")))[0] == 200
    edge.clock.set(T0 + 1_000)
    await until(lambda: len(pings(edge, "tick")) == 1 and row(edge, "tick").slot == 1)

    status, paused = await act(edge, "tick", "pause", "p-1")
    assert status == 200 and paused["code"] == "COMMITTED", paused
    status, shown = await edge.call("GET", f"{PATH}/tick")
    assert status == 200 and shown["status"] == "PAUSED" and shown["slot"] == 1
    # Paused already: a no-op answer; the same request id again: a duplicate.
    again = await act(edge, "tick", "pause", "p-2")
    assert again[0] == 200 and again[1]["code"] == "UNCHANGED", again
    same = await act(edge, "tick", "pause", "p-1")
    assert same[0] == 200 and same[1]["code"] == "DUPLICATE" and same[1]["duplicate"]
    assert len(events(edge.log, BOOK, "wow.SchedulePaused")) == 1

    # Four slots come due (11 s, 21 s, 31 s, 41 s) while it is paused; a timer due at
    # 44 s that is not paused fires, so the runner has been past them all.
    assert (await edge.call("PUT", f"{PATH}/control", once(T0 + 44_000, "control")))[0] == 200
    edge.clock.set(T0 + 45_000)
    await until(lambda: len(pings(edge, "control")) == 1)
    assert len(pings(edge, "tick")) == 1, "a paused timer fired"
    assert row(edge, "tick").status is TimerStatus.PAUSED

    status, resumed = await act(edge, "tick", "resume", "r-1")
    assert status == 200 and resumed["code"] == "COMMITTED", resumed
    # Caught up at 45 s: the latest slot due (4, at 41 s) fires once, 1 to 3 skipped.
    await until(lambda: len(pings(edge, "tick")) == 2 and row(edge, "tick").slot == 5)
    latest = pings(edge, "tick")[-1]
    assert latest.request_id is not None and latest.request_id.endswith("#4")
    after = row(edge, "tick")
    assert (after.status, after.skipped, after.due_at) == (TimerStatus.PENDING, 3, T0 + 51_000)
    running = await act(edge, "tick", "resume", "r-2")
    assert running[0] == 200 and running[1]["code"] == "UNCHANGED", running


async def test_a_resume_of_a_rule_that_does_not_coalesce_sends_each_slot(edge: Edge) -> None:
    body = interval(T0 + 1_000, 10_000, "each", coalesce=False)
    assert (await edge.call("PUT", f"{PATH}/each", body))[0] == 200
    assert (await act(edge, "each", "pause", "p-1"))[1]["code"] == "COMMITTED"
    edge.clock.set(T0 + 25_000)  # slots 0, 1 and 2 come due
    assert (await act(edge, "each", "resume", "r-1"))[1]["code"] == "COMMITTED"
    await until(lambda: len(pings(edge, "each")) == 3 and row(edge, "each").slot == 3)
    sent_ids = [e.request_id or "" for e in pings(edge, "each")]
    assert [i.rsplit("#", 1)[1] for i in sent_ids] == ["0", "1", "2"]
    assert row(edge, "each").skipped == 0


async def test_a_trigger_fires_once_even_sent_again_and_leaves_the_rule(edge: Edge) -> None:
    body = interval(T0 + 60_000, 60_000, "now")
    assert (await edge.call("PUT", f"{PATH}/now", body))[0] == 200
    before = row(edge, "now")
    status, answer = await act(edge, "now", "trigger", "t-1")
    assert status == 200 and answer["code"] == "COMMITTED", answer
    await until(lambda: len(pings(edge, "now")) == 1)
    again = await act(edge, "now", "trigger", "t-1")
    assert again[0] == 200 and again[1]["code"] == "DUPLICATE", again
    # A second trigger is a second fire; the retry of the first made none.
    assert (await act(edge, "now", "trigger", "t-2"))[1]["code"] == "COMMITTED"
    await until(lambda: len(pings(edge, "now")) == 2)
    assert sorted(sent_base(e.request_id or "") for e in pings(edge, "now")) == ["t-1>0", "t-2>0"]
    triggered = events(edge.log, BOOK, "wow.ScheduleTriggered")
    assert [(e.body["key"], sent_base(e.body["request_id"])) for e in triggered] == [
        ("now", "t-1>0"),
        ("now", "t-2>0"),
    ]
    # The rule and its next slot are as they were; the slot still fires when due.
    assert row(edge, "now") == before
    edge.clock.set(T0 + 60_000)
    await until(lambda: len(pings(edge, "now")) == 3 and row(edge, "now").slot == 1)


async def test_a_trigger_id_that_leaves_no_room_for_its_send_is_a_400(edge: Edge) -> None:
    """The book sends the timer's command as `<request id>>0@<digest>` (hashed when that is
    longer than 300 characters); a trigger's own id is at most 298, as `<request id>>0` was
    (a longer one was a 502, an ERROR and a dead letter)."""
    assert (await edge.call("PUT", f"{PATH}/edge", interval(T0 + 60_000, 60_000, "edge")))[0] == 200
    for rid in ("t" * 299, "t" * 300):
        status, answer = await act(edge, "edge", "trigger", rid)
        assert (status, answer["field"]) == (400, "request_id"), answer
        assert "at most 298 characters" in answer["error"], answer
        query = await edge.call("POST", f"{PATH}/edge/trigger?request_id={rid}")
        assert (query[0], query[1]["field"]) == (400, "request_id"), query
    assert events(edge.log, BOOK, "wow.ScheduleTriggered") == []
    # the longest that fits fires once, sent again too (its events' ids fit as well)
    rid = "t" * 298
    assert (await act(edge, "edge", "trigger", rid))[1]["code"] == "COMMITTED"
    assert (await act(edge, "edge", "trigger", rid))[1]["code"] == "DUPLICATE"
    await until(lambda: len(pings(edge, "edge")) == 1)
    (triggered,) = events(edge.log, BOOK, "wow.ScheduleTriggered")
    # Scoped to the trigger of its key, then hashed (`sha256:`) to fit within 298.
    scoped = scoped_request_id("trigger", "edge", rid)
    assert scoped.startswith("trigger:") and len(scoped) <= 298
    sent = sent_request_id(triggered.aggregate, scoped, 0)
    assert triggered.body["request_id"] == sent
    assert [e.request_id for e in pings(edge, "edge")] == [sent]


async def test_a_paused_timer_can_be_triggered_and_stays_paused(edge: Edge) -> None:
    assert (await edge.call("PUT", f"{PATH}/held", once(T0 + 5_000, "held")))[0] == 200
    assert (await act(edge, "held", "pause", "p-1"))[1]["code"] == "COMMITTED"
    assert (await act(edge, "held", "trigger", "t-1"))[1]["code"] == "COMMITTED"
    await until(lambda: len(pings(edge, "held")) == 1)
    assert row(edge, "held").status is TimerStatus.PAUSED


async def test_actions_on_a_key_with_no_timer_or_a_finished_one_are_4xx(edge: Edge) -> None:
    for action in ("pause", "resume", "trigger"):
        status, answer = await act(edge, "nothing", action, f"{action}-missing")
        assert (status, answer["field"]) == (404, "key"), answer
        assert "has no timer 'nothing' (never set, cancelled, or ended" in answer["error"]
        assert answer["request_id"] == f"{action}-missing"
    # FIRED, and CANCELLED: this node keeps the row, and says what it is.
    assert (await edge.call("PUT", f"{PATH}/done", once(T0 + 1_000, "done")))[0] == 200
    edge.clock.set(T0 + 1_000)
    await until(lambda: row(edge, "done").status is TimerStatus.FIRED)
    status, answer = await act(edge, "done", "pause", "p-done")
    assert (status, answer["field"]) == (409, "key")
    assert (
        answer["error"] == "shop.reminders/(0)/o-1's timer 'done' is FIRED: nothing to pause "
        "(set it again to start it anew)"
    )
    assert (await edge.call("PUT", f"{PATH}/gone", once(T0 + 9_000, "gone")))[0] == 200
    assert (await edge.call("DELETE", f"{PATH}/gone"))[0] == 200
    status, answer = await act(edge, "gone", "trigger", "t-gone")
    assert (status, answer["field"]) == (409, "key") and "is CANCELLED" in answer["error"]
    assert pings(edge, "done") != [] and pings(edge, "gone") == []
    assert events(edge.log, BOOK, "wow.SchedulePaused") == []


async def test_a_fired_once_timer_is_a_409_on_a_node_not_keeping_its_row(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a node that does not keep the owner's partition, a trigger of a fired once-timer
    sent its command again (200): the book refuses it now, as ended, with the 409 its
    owner answers, also once the timer is paused. A pause is appended: the book cannot
    tell a FIRED row from a PARKED one, which the table pauses; it leaves a FIRED one as
    it is. The resume that follows is its undoing, and changes no row either."""
    assert (await edge.call("PUT", f"{PATH}/done", once(T0 + 1_000, "done")))[0] == 200
    edge.clock.set(T0 + 1_000)
    await until(lambda: row(edge, "done").status is TimerStatus.FIRED)
    owner_says = await act(edge, "done", "trigger", "t-owner")

    async def elsewhere(self: TimerRoutes, owner: Any, key: str) -> None:
        return None  # as on a node of the group not keeping the partition

    monkeypatch.setattr(TimerRoutes, "_held", elsewhere)
    fired = row(edge, "done")
    for n, action in enumerate(("trigger", "pause", "trigger")):
        status, answer = await act(edge, "done", action, f"{action}-elsewhere-{n}")
        if action == "pause":
            assert (status, answer["code"]) == (200, "COMMITTED"), answer
            continue
        assert (status, answer["field"]) == (409, "key"), answer
        assert answer["error"].startswith(
            "RULE_ENDED: shop.reminders/(0)/o-1's timer 'done': its rule ended at "
        ), answer
        assert answer["error"].endswith("set it again to start it anew)")
    assert (await act(edge, "done", "resume", "r-elsewhere"))[1]["code"] == "COMMITTED"
    assert owner_says[0] == 409 and "is FIRED" in owner_says[1]["error"]  # as before
    assert events(edge.log, BOOK, "wow.ScheduleTriggered") == []
    await until(lambda: len(events(edge.log, BOOK, "wow.ScheduleResumed")) == 1)
    assert row(edge, "done") == fired
    assert len(pings(edge, "done")) == 1


async def test_an_action_sent_again_after_its_timer_ended_is_its_duplicate(edge: Edge) -> None:
    """A client's retry (same request id) of an action carried out before its timer ended
    was a 409 "nothing to trigger": told nothing was done when it was. It is the book's
    DUPLICATE (nothing more sent); a new request id on the ended timer is still a 409."""
    assert (await edge.call("PUT", f"{PATH}/late", once(T0 + 60_000, "late")))[0] == 200
    assert (await act(edge, "late", "trigger", "t-1"))[1]["code"] == "COMMITTED"
    await until(lambda: len(pings(edge, "late")) == 1)
    edge.clock.set(T0 + 60_000)
    await until(lambda: row(edge, "late").status is TimerStatus.FIRED)
    status, answer = await act(edge, "late", "trigger", "t-1")
    assert (status, answer["code"], answer["duplicate"]) == (200, "DUPLICATE", True), answer
    assert len(pings(edge, "late")) == 2  # the trigger's and the slot's: none more
    assert (await act(edge, "late", "trigger", "t-2"))[0] == 409
    # A pause, then a cancel: the pause sent again is its DUPLICATE, not a 409.
    assert (await edge.call("PUT", f"{PATH}/held", interval(T0 + 120_000, 60_000, "h")))[0] == 200
    assert (await act(edge, "held", "pause", "p-1"))[1]["code"] == "COMMITTED"
    assert (await edge.call("DELETE", f"{PATH}/held"))[0] == 200
    await until(lambda: row(edge, "held").status is TimerStatus.CANCELLED)
    status, answer = await act(edge, "held", "pause", "p-1")
    assert (status, answer["code"]) == (200, "DUPLICATE"), answer
    assert len(events(edge.log, BOOK, "wow.SchedulePaused")) == 1


@pytest.mark.parametrize("key", ["its rule ended at", "RULE_ENDED: x", "x: its rule ended at 1"])
async def test_a_missing_key_named_as_the_ended_refusal_is_a_404(edge: Edge, key: str) -> None:
    """The 409 was chosen by the refusal's text, which holds the key from the URL: a key
    the book has no timer under, named `its rule ended at`, was a 409, not a 404."""
    for action in ("pause", "trigger"):
        status, answer = await act(edge, quote(key, safe=""), action, f"{action}-{key[:3]}")
        assert (status, answer["field"]) == (404, "key"), answer
        assert f"has no timer {key!r}" in answer["error"], answer


def _refused(cmd: CommandEnvelope, refusal: str | None) -> CommandResult:
    """A REJECTED result as a book of any version writes it: without `refusal` (before it
    was typed), with RULE_ENDED, or with a code a newer version added; its text unprefixed."""
    raw: dict[str, Any] = {
        "request_id": cmd.request_id,
        "code": "REJECTED",
        "aggregate": cmd.aggregate.model_dump(mode="json"),
        "message": "the book's own words",
        "decided_at": T0,
    }
    return decode(CommandResult, orjson.dumps(raw | ({"refusal": refusal} if refusal else {})))


@pytest.mark.parametrize(
    ("refusal", "status"), [("RULE_ENDED", 409), ("A_NEWER_REFUSAL", 404), (None, 404)]
)
async def test_the_409_comes_from_the_results_typed_refusal(
    edge: Edge, monkeypatch: pytest.MonkeyPatch, refusal: str | None, status: int
) -> None:
    """The ended refusal is the result's typed code, whatever its text says; a code this
    version does not know is a plain refusal (an action's 404), as is a result without it."""

    async def submit(producer: Any, reader: Any, cmd: CommandEnvelope, *_: Any) -> CommandResult:
        return _refused(cmd, refusal)

    monkeypatch.setattr(app.ops.timer_routes, "submit", submit)
    for action in ("pause", "trigger"):
        got, answer = await act(edge, "k", action, f"{action}-1")
        assert (got, answer["field"], answer["request_id"]) == (status, "key", f"{action}-1")
        said = "the book's own words"
        assert answer["error"] == (f"RULE_ENDED: {said}" if status == 409 else said), answer


async def test_a_once_timer_past_its_end_and_the_books_retention_is_a_404(edge: Edge) -> None:
    """The book forgets a timer whose rule ended more than `BOOK_RETENTION` ago (#20), as
    the table deletes its finished row: an action on its key is then a never-set key's."""
    assert (await edge.call("PUT", f"{PATH}/once", once(T0 + 1_000, "once")))[0] == 200
    edge.clock.set(T0 + 1_000)
    await until(lambda: row(edge, "once").status is TimerStatus.FIRED)
    edge.clock.set(T0 + 1_000 + BOOK_RETENTION + 60_000)
    await until(lambda: all(t.key != "once" for t in rows(edge.log)))  # the row deleted
    for action in ("pause", "resume", "trigger"):
        status, answer = await act(edge, "once", action, f"{action}-once")
        assert (status, answer["field"]) == (404, "key"), answer
        assert "has no timer 'once' (never set, cancelled, or ended" in answer["error"]
    # the next event drops it from the book's state: still a 404
    assert (await edge.call("PUT", f"{PATH}/next", once(T0 + 2 * BOOK_RETENTION, "n")))[0] == 200
    assert (await act(edge, "once", "trigger", "t-once-2"))[0] == 404
    assert (await act(edge, "next", "pause", "p-next"))[1]["code"] == "COMMITTED"
    assert len(pings(edge, "once")) == 1
    assert events(edge.log, BOOK, "wow.ScheduleTriggered") == []


@pytest.mark.parametrize(
    ("path", "kw", "status", "field"),
    [
        (f"{PATH}/k/pause", {"data": b'{"request_id": "x"}'}, 400, "body"),
        ("/timers/shop.order/o/k/pause", {}, 404, "type"),
        (f"{PATH}/k/resume?tenant=" + "t" * 201, {}, 400, "tenant"),
        (f"{PATH}/{'k' * 201}/trigger", {}, 400, "key"),
    ],
)
async def test_a_bad_action_request_is_a_4xx_naming_its_field_and_sends_nothing(
    edge: Edge, path: str, kw: dict[str, Any], status: int, field: str
) -> None:
    got, answer = await edge.call("POST", path, kw.pop("data", None))
    assert (got, answer["field"]) == (status, field), answer
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(2))


@pytest.mark.parametrize("body", [b"{}", b"{ }", b" {\r\n\t}\n"])
async def test_an_empty_object_is_no_body(edge: Edge, body: bytes) -> None:
    """As the docs say: no body, or an empty JSON object, however it is spaced."""
    assert (await edge.call("PUT", f"{PATH}/e", once(T0 + 9_000, "e")))[0] == 200
    status, answer = await edge.call("POST", f"{PATH}/e/pause?request_id=p-e", body)
    assert (status, answer["code"], answer["request_id"]) == (200, "COMMITTED", "p-e")


@pytest.mark.parametrize("body", [b"[]", b"null", b"{}{}", b'{"request_id": "x"}', b"{"])
async def test_a_body_other_than_an_empty_object_is_a_400(edge: Edge, body: bytes) -> None:
    got, answer = await edge.call("POST", f"{PATH}/k/trigger?request_id=t-k", body)
    assert (got, answer["field"]) == (400, "body"), answer
    assert "takes no body" in answer["error"], answer
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(2))


async def test_actions_need_the_token_and_send_nothing_without_it(edge: Edge) -> None:
    for action in ("pause", "resume", "trigger"):
        assert (await edge.call("POST", f"{PATH}/k/{action}", token=None))[0] == 401
        assert (await edge.call("POST", f"{PATH}/k/{action}", token="wrong"))[0] == 401
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(2))


async def test_the_log_replayed_into_an_empty_table_holds_the_paused_row(edge: Edge) -> None:
    """A rebuild replays the log into an empty table: the pause and the resume in it make
    the rows the node's table has."""
    assert (await edge.call("PUT", f"{PATH}/a", interval(T0 + 1_000, 10_000, "a")))[0] == 200
    assert (await edge.call("PUT", f"{PATH}/b", interval(T0 + 1_000, 10_000, "b")))[0] == 200
    assert (await act(edge, "a", "pause", "p-a"))[1]["code"] == "COMMITTED"
    assert (await act(edge, "b", "pause", "p-b"))[1]["code"] == "COMMITTED"
    edge.clock.set(T0 + 35_000)
    assert (await act(edge, "b", "resume", "r-b"))[1]["code"] == "COMMITTED"
    # b fires its caught-up slot (3, at 31 s), and waits for slot 4
    await until(lambda: len(pings(edge, "b")) == 1 and row(edge, "b").slot == 4)
    store = MemoryTimerStore(2)
    for p in range(2):
        for r in edge.log.records(BOOK.events, p):
            event = EventEnvelope.model_validate_json(r.value or b"")
            if (op := timer_op(event, p)) is not None:
                await apply_all(store, [op])
    replayed = {t.key: t for t in await store.timers_of(row(edge, "a").owner)}
    assert replayed["a"] == row(edge, "a") and replayed["a"].status is TimerStatus.PAUSED
    # b as the resume left it (its firing is the runner's, not the log's)
    assert (replayed["b"].status, replayed["b"].slot, replayed["b"].skipped) == (
        TimerStatus.PENDING,
        3,
        3,
    )


async def test_the_docs_post_lines_are_answered_as_they_say(edge: Edge) -> None:
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    lines = re.findall(r"^curl -X POST .*/timers/shop\.reminders/.*$", text, flags=re.M)
    assert len(lines) == 3
    # The timer they name, due after the fake clock's time (the docs' PUT is due before it).
    pay = {**interval(T0 + 60_000, 60_000, "pay"), "target": {"type": "shop.order"}}
    assert (await edge.call("PUT", "/timers/shop.reminders/o-42/pay", pay))[0] == 200
    answers = []
    for line in lines:
        words = shlex.split(line.replace("$TICKWHEEL_WEB_TOKEN", TOKEN))
        headers = dict(words[i + 1].split(": ", 1) for i, w in enumerate(words) if w == "-H")
        assert "-d" not in words  # no body: the request id is the header
        url = URL(words[-1])
        method = words[words.index("-X") + 1]
        answers.append(await edge.call(method, url.raw_path, token=None, headers=headers))
    codes = [(status, a["code"], a["request_id"]) for status, a in answers]
    assert codes == [
        (200, "COMMITTED", "pay-o-42-pause"),
        (200, "COMMITTED", "pay-o-42-resume"),
        (200, "COMMITTED", "pay-o-42-now"),
    ]
    await until(lambda: len(events(edge.log, PINGS, "Pinged")) == 1)
    (fired,) = events(edge.log, PINGS, "Pinged")
    assert sent_base(fired.request_id or "") == "pay-o-42-now>0" and fired.aggregate.id == "o-42"


# --- the command line ------------------------------------------------------------------------


def line(action: str, *more: str) -> list[str]:
    return ["timers", action, "--type", "shop.reminders", "--owner", "o-1", "--key", "k", *more]


@pytest.mark.parametrize(
    ("action", "type_"),
    [("pause", "wow.PauseTimer"), ("resume", "wow.ResumeTimer"), ("trigger", "wow.TriggerTimer")],
)
def test_an_action_sends_the_books_command_and_says_its_answer(
    sent: list[CommandEnvelope], action: str, type_: str
) -> None:
    result = CliRunner().invoke(cli, line(action, "--request-id", "a-1", "--tenant", "t1"))
    assert result.exit_code == 0, result.output
    assert (
        result.stdout == f"{action} shop.reminders/t1/o-1 'k': COMMITTED (request a-1, version 3)\n"
    )
    (cmd,) = sent
    rid = scoped_request_id(action, "k", "a-1")
    assert (cmd.type, cmd.request_id, cmd.body) == (type_, rid, {"key": "k"})
    assert (cmd.aggregate.type_name, cmd.aggregate.tenant, cmd.aggregate.id) == (
        "shop.reminders",
        "t1",
        "o-1",
    )


def test_a_no_op_is_done_and_a_refusal_or_silence_exits_1(
    sent: list[CommandEnvelope], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(ANSWERS, "same", ResultCode.UNCHANGED)
    same = CliRunner().invoke(cli, line("pause", "--request-id", "same"))
    assert same.exit_code == 0, same.output
    assert "UNCHANGED already so: nothing written" in same.stdout
    dup = CliRunner().invoke(cli, line("trigger", "--request-id", "dup", "--json"))
    assert dup.exit_code == 0 and orjson.loads(dup.stdout)["duplicate"] is True
    no = CliRunner().invoke(cli, line("resume", "--request-id", "no"))
    assert no.exit_code == 1 and no.stderr == "error: resume refused: REJECTED no\n"
    silent = CliRunner().invoke(cli, line("trigger", "--request-id", "silent"))
    assert silent.exit_code == 1 and "send it again with --request-id silent" in silent.stderr


@pytest.mark.parametrize("action", ["trigger"])
def test_an_action_on_a_timer_whose_rule_ended_exits_1_saying_so(
    monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """The command answered by the book's own decision, its once timer ended at T0."""
    owner = AggregateRef(context="shop", aggregate="reminders", id="o-1")
    body = {
        "key": "k",
        "rule": {"kind": "once", "at": T0},
        "target": {"context": "shop", "aggregate": "order", "id": "p-1"},
        "command": {"type": "RemindToPay"},
    }
    put = CommandEnvelope(request_id="s", type=SET_TIMER, aggregate=owner, body=body, issued_at=0)
    stored = decide(SERVICE_BOOK, None, put, now=T0 - 1_000, seen=False).stored
    assert stored is not None
    sent: list[CommandEnvelope] = []

    async def send(kafka: Any, cmd: CommandEnvelope, wait_s: float) -> CommandResult:
        sent.append(cmd)
        d = decide(SERVICE_BOOK, stored, cmd, now=T0 + 5_000, seen=False)
        return CommandResult(
            request_id=cmd.request_id,
            code=d.code,
            aggregate=cmd.aggregate,
            message=d.message,
            refusal=d.refusal,
            decided_at=T0 + 5_000,
        )

    monkeypatch.setattr(app.cli.timer_changes, "send_change", send)
    result = CliRunner().invoke(cli, line(action, "--request-id", "a-1"))
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: {action} refused: REJECTED RULE_ENDED: shop.reminders/(0)/o-1's timer 'k': "
        "its rule ended at 2027-01-15T08:00:00.000Z (its last slot is due or fired): nothing to "
        f"{action} (set it again to start it anew)\n"
    )
    assert [c.type for c in sent] == [f"wow.{action.capitalize()}Timer"]


@pytest.mark.parametrize("refusal", ["A_NEWER_REFUSAL", None])
def test_a_refusal_code_this_version_does_not_know_exits_1_as_a_plain_refusal(
    monkeypatch: pytest.MonkeyPatch, refusal: str | None
) -> None:
    async def send(kafka: Any, cmd: CommandEnvelope, wait_s: float) -> CommandResult:
        return _refused(cmd, refusal)

    monkeypatch.setattr(app.cli.timer_changes, "send_change", send)
    result = CliRunner().invoke(cli, line("trigger", "--request-id", "a-1"))
    assert result.exit_code == 1, result.output
    assert result.stderr == "error: trigger refused: REJECTED the book's own words\n"


def test_an_actions_bad_options_exit_2_and_send_nothing(sent: list[CommandEnvelope]) -> None:
    long_key = CliRunner().invoke(cli, [*line("pause")[:-1], "k" * 201])
    assert long_key.exit_code == 2 and long_key.stderr.startswith("error: key:")
    bad_type = CliRunner().invoke(cli, ["timers", "resume", "--type", "nodot", "--owner", "o",
                                        "--key", "k"])  # fmt: skip
    # as `timers set|cancel` say a bad type (exit 2, one line)
    assert bad_type.exit_code == 2, bad_type.output
    assert bad_type.stderr.startswith("error: aggregate type 'nodot' must be")
    assert not sent


def test_a_trigger_id_too_long_for_its_send_exits_2_and_sends_nothing(
    sent: list[CommandEnvelope],
) -> None:
    result = CliRunner().invoke(cli, line("trigger", "--request-id", "t" * 299))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: request_id: a trigger's request id is at most 298")
    assert not sent
    # a pause's may be 300 characters: scoped, it is hashed to fit
    assert CliRunner().invoke(cli, line("pause", "--request-id", "p" * 300)).exit_code == 0
    assert [c.request_id for c in sent] == [scoped_request_id("pause", "k", "p" * 300)]
    assert "sha256:" in sent[0].request_id


@pytest.mark.parametrize("action", ["pause", "resume", "trigger"])
def test_the_docs_action_lines_parse_and_send_as_written(
    sent: list[CommandEnvelope], action: str
) -> None:
    """docs/operations.md's `tickwheel timers <action> …` line, every optional part given
    (the integration test runs them against a worker)."""
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    (span,) = re.findall(rf"`(tickwheel timers {action} [^`]+)`", text)
    words = [w.removeprefix("[").removesuffix("]") for w in shlex.split(" ".join(span.split()))]
    result = CliRunner().invoke(cli, words[1:])
    assert result.exit_code == 0, result.output
    (cmd,) = sent
    assert cmd.body == {"key": "pay"} and cmd.aggregate.tenant == "t1"
    assert cmd.type == f"wow.{action.capitalize()}Timer"
    assert orjson.loads(result.stdout)["code"] == "COMMITTED"
