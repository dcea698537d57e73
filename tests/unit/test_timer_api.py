"""Timers set, cancelled and shown over the web edge (`PUT|DELETE|GET /timers/{type}/{owner}/
{key}`) through a timer book, on a whole node on the in-memory log: the timer set fires
once, a cancelled one never; a change sent again with its request id writes nothing and is
answered DUPLICATE; writes need the web token; a bad request is a 4xx naming its field;
`GET /openapi.json` describes every JSON route. And `tickwheel timers set|cancel`'s
parsing, answers and exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeAlias

import orjson
import pytest
from fakes import T0, WEB_TOKEN, FakeClock, WebNode, web_node
from pydantic import BaseModel
from typer.testing import CliRunner
from yarl import URL

import app.cli.timer_changes
import app.ops.timer_routes
from app.cli import cli
from app.clients.book_commands import scoped_request_id, unscoped_request_id
from app.clients.timer_book import timer_book
from app.errors import BadRecord, KafkaUnavailable
from app.kafka.connection import Connectable
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision
from app.ops.openapi import JSON_ROUTES
from app.ops.timer_api import submit
from app.ops.web import WebServer
from app.protocol.topics import AggregateTopics
from app.protocol.wire import CommandEnvelope, CommandResult, EventEnvelope, ResultCode, decode
from app.service import Service
from tables import AggregateRef, Timer, TimerStatus
from tables.slots import jitter_offset

P = 2
TOKEN = WEB_TOKEN
BOOK = AggregateTopics("shop", "reminders")
PINGS = AggregateTopics("shop", "order")


class Pings(BaseModel):
    n: int = 0


order = AggregateType("shop", "order", Pings)


@order.command("RemindToPay")
def _ping(state: Pings, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {"n": state.n + 1, "note": cmd.body.get("note")})


SERVICE = Service(aggregates=(timer_book("shop", "reminders"), order))


Edge: TypeAlias = WebNode
"""The node of `SERVICE` with its web edge (`fakes.web_node`), on a fake clock at T0."""


def rows(log: MemoryLog) -> list[Timer]:
    latest: dict[bytes, bytes | None] = {}
    for p in range(P):
        for r in log.records(BOOK.timers_changelog, p):
            assert r.key is not None
            latest[r.key] = r.value
    return [Timer.model_validate_json(v) for v in latest.values() if v is not None]


def events(log: MemoryLog, topics: AggregateTopics, type_: str) -> list[EventEnvelope]:
    out = []
    for p in range(P):
        for r in log.records(topics.events, p):
            with contextlib.suppress(BadRecord):
                if (e := decode(EventEnvelope, r.value)).type == type_:
                    out.append(e)
    return out


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[Edge]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0), Edge, partitions=P) as e:
        yield e


def put_body(at: int, **more: Any) -> dict[str, Any]:
    return {
        "rule": {"kind": "once", "at": at},
        "target": {"type": "shop.order", "id": "p-1"},
        "command": {"type": "RemindToPay", "body": {"note": "hi"}},
        **more,
    }


async def test_a_timer_put_fires_once_and_a_put_again_with_its_request_id_writes_nothing(
    edge: Edge,
) -> None:
    status, answer = await edge.call(
        "PUT", "/timers/shop.reminders/o-1/remind", put_body(T0 + 1_000, request_id="r-1")
    )
    assert status == 200, answer
    assert answer["code"] == "COMMITTED" and answer["duplicate"] is False
    assert (answer["request_id"], answer["key"], answer["version"]) == ("r-1", "remind", 1)
    assert answer["owner"]["id"] == "o-1"
    # Shown by the node keeping the partition, as its table has it.
    status, shown = await edge.call("GET", "/timers/shop.reminders/o-1/remind", token=None)
    assert status == 200, shown
    assert shown["status"] == "PENDING" and shown["due_at"] == T0 + 1_000
    assert shown["target"]["id"] == "p-1" and shown["command"]["type"] == "RemindToPay"

    again = await edge.call(
        "PUT", "/timers/shop.reminders/o-1/remind", put_body(T0 + 1_000, request_id="r-1")
    )
    assert again[0] == 200 and again[1]["code"] == "DUPLICATE" and again[1]["duplicate"]
    assert len(events(edge.log, BOOK, "wow.ScheduleSet")) == 1  # nothing written again

    edge.clock.set(T0 + 1_000)
    await until(lambda: [t.status for t in rows(edge.log)] == [TimerStatus.FIRED])
    (pinged,) = events(edge.log, PINGS, "Pinged")
    assert pinged.aggregate.id == "p-1" and pinged.body["note"] == "hi"


async def test_a_put_replaces_and_a_delete_cancels_and_nothing_fires(edge: Edge) -> None:
    path = "/timers/shop.reminders/o-2/later"
    assert (await edge.call("PUT", path, put_body(T0 + 1_000)))[0] == 200
    moved = await edge.call("PUT", path, put_body(T0 + 5_000))
    assert moved[0] == 200 and moved[1]["version"] == 2
    assert [t.due_at for t in rows(edge.log)] == [T0 + 5_000]
    status, answer = await edge.call("DELETE", path, headers={"Idempotency-Key": "c-1"})
    assert status == 200 and answer["code"] == "COMMITTED" and answer["request_id"] == "c-1"
    again = await edge.call("DELETE", path, headers={"Idempotency-Key": "c-1"})
    assert again[1]["code"] == "DUPLICATE"
    await until(lambda: [t.status for t in rows(edge.log)] == [TimerStatus.CANCELLED])
    edge.clock.set(T0 + 10_000)
    assert (await edge.call("GET", path))[1]["status"] == "CANCELLED"
    assert events(edge.log, PINGS, "Pinged") == []
    missing = await edge.call("GET", "/timers/shop.reminders/o-2/nothing")
    assert missing == (
        404,
        {
            "error": "shop.reminders/(0)/o-2 has no timer 'nothing'",
            "field": "key",
            "request_id": None,
        },
    )


async def test_writes_need_the_token_and_send_nothing_without_it(edge: Edge) -> None:
    path = "/timers/shop.reminders/o-3/k"
    assert (await edge.call("PUT", path, put_body(T0 + 1_000), token=None))[0] == 401
    assert (await edge.call("PUT", path, put_body(T0 + 1_000), token="wrong"))[0] == 401
    assert (await edge.call("DELETE", path, token=None))[0] == 401
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/timers/shop.reminders/o/k", "{not json", 400, "body"),
        ("/timers/shop.reminders/o/k", "[1]", 400, "body"),
        ("/timers/shop.order/o/k", put_body(T0 + 1), 404, "type"),
        ("/timers/shop.nobook/o/k", put_body(T0 + 1), 404, "type"),
        ("/timers/shop.reminders/o/k?tenant=" + "t" * 201, put_body(T0 + 1), 400, "tenant"),
        (
            "/timers/shop.reminders/o/k",
            {"target": {"type": "shop.order"}, "command": {"type": "P"}},
            400,
            "rule",
        ),
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, rule={"kind": "interval", "every": 0, "start": 0}),
            400,
            "rule.interval.every",
        ),
        ("/timers/shop.reminders/o/k", put_body(T0 + 1, command={"body": {}}), 400, "command.type"),
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, target={"type": "nodot"}),
            400,
            "target.type",
        ),
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, target={"type": "shop.reminders"}),
            400,
            "target",
        ),
        ("/timers/shop.reminders/o/k", put_body(T0 + 1, extra=1), 400, "extra"),
        # strict, as records are: a string or a float is no epoch ms, `true` no jitter
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, rule={"kind": "once", "at": str(T0)}),
            400,
            "rule.once.at",
        ),
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, rule={"kind": "once", "at": T0 * 1.0}),
            400,
            "rule.once.at",
        ),
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, rule={"kind": "once", "at": T0, "jitter": True}),
            400,
            "rule.once.jitter",
        ),
        ("/timers/shop.reminders/o/" + "k" * 201, put_body(T0 + 1), 400, "key"),
        # a control character in a new name (`tables.refs.control_character`)
        ("/timers/shop.reminders/o%00/k", put_body(T0 + 1), 400, "owner"),
        ("/timers/shop.reminders/o/k%0A", put_body(T0 + 1), 400, "key"),
        ("/timers/shop.reminders/o/k?tenant=t%1B", put_body(T0 + 1), 400, "tenant"),
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, target={"type": "shop.order", "id": "p\u007f"}),
            400,
            "target.id",
        ),
        (
            "/timers/shop.reminders/o/k",
            put_body(T0 + 1, rule={"kind": "interval", "every": 1000, "start": 0, "count": 1}),
            400,
            "rule",
        ),
    ],
)
async def test_a_bad_request_is_a_4xx_naming_its_field_and_sends_nothing(
    edge: Edge, path: str, body: Any, status: int, field: str
) -> None:
    got, answer = await edge.call("PUT", path, body)
    assert (got, answer["field"]) == (status, field), answer
    assert answer["error"]
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))


async def test_a_body_integer_past_64_bits_is_a_400_as_on_the_commands_topic(edge: Edge) -> None:
    # orjson read it as a float, 1.2e+29, and the timer was set with that
    big = orjson.dumps(put_body(T0 + 1)).replace(b'"hi"', b"%d" % 10**29)
    status, answer = await edge.call("PUT", "/timers/shop.reminders/o/k", big)
    assert (status, answer["field"]) == (400, "command.body"), answer
    assert f"body.note: integer {10**29} is outside signed 64 bits" in answer["error"]
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))


async def test_the_openapi_document_describes_every_json_route(edge: Edge) -> None:
    status, doc = await edge.call("GET", "/openapi.json", token=None)
    assert status == 200 and doc["openapi"].startswith("3.1")
    described = {
        (m.upper(), path)
        for path, item in doc["paths"].items()
        for m in item
        if m in ("get", "put", "delete", "post")
    }
    assert described == set(JSON_ROUTES)
    # Every route the server has is a JSON one, or one of the page's (HTML, forms, metrics).
    server = WebServer(edge.node, 0)
    await server.start()
    try:
        assert server._runner is not None
        routes = {
            (r.method, r.resource.canonical)
            for r in server._runner.app.router.routes()
            if r.method != "HEAD" and r.resource is not None
        }
    finally:
        await server.stop()
    page = {("GET", "/"), ("GET", "/metrics"), ("POST", "/timers/retry"), ("POST", "/timers/skip")}
    page |= {("POST", "/page/timer"), ("POST", "/page/job")}
    assert routes == set(JSON_ROUTES) | page
    text = orjson.dumps(doc).decode()
    for ref in set(re.findall(r'"\$ref":"#/components/schemas/([^"]+)"', text)):
        assert ref in doc["components"]["schemas"], ref
    put = doc["paths"]["/timers/{type}/{owner}/{key}"]["put"]
    assert put["security"] == [{"webToken": []}]
    schema = doc["components"]["schemas"]["TimerPut"]
    assert set(schema["required"]) == {"rule", "target", "command"}


async def test_a_malformed_request_is_a_400_on_every_write_route_as_openapi_says(
    edge: Edge,
) -> None:
    """One status for a request that cannot be sent, on /timers as on /jobs: a 400 naming
    its field (a PUT /timers body that did not validate was a 422, a /jobs one a 400); a
    422 is only a command the aggregate refused, answered as such (a TimerAnswer, a
    JobAnswer)."""
    _, doc = await edge.call("GET", "/openapi.json", token=None)
    writes = {
        (method, path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in ("put", "post", "delete") and op.get("security")
    }
    assert {p for _, p in writes} >= {
        "/timers/{type}/{owner}/{key}",
        "/jobs/{context}/{job}/trigger",
    }
    for (method, path), op in writes.items():
        assert "400" in op["responses"], (method, path)
        refused = op["responses"].get("422")
        if refused is not None:
            schema = refused["content"]["application/json"]["schema"]
            assert schema["$ref"].rsplit("/", 1)[1] in ("TimerAnswer", "JobAnswer"), (method, path)
            assert "validate" not in refused["description"], (method, path)
    put = await edge.call("PUT", "/timers/shop.reminders/o/k", {"rule": 5})
    jobs = await edge.call("POST", "/jobs/shop/nightly/trigger", {"tenants": 5})
    assert (put[0], put[1]["field"]) == (400, "rule"), put
    assert jobs[0] == 400, jobs  # (no job here: the context is named)
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))


async def test_a_change_not_answered_in_time_is_none() -> None:
    log = MemoryLog()
    cmd = CommandEnvelope(
        request_id="r",
        type="wow.CancelTimer",
        aggregate=AggregateRef(context="shop", aggregate="reminders", id="o"),
        body={"key": "k"},
        issued_at=T0,
    )
    log.create_topic(BOOK.commands, P)
    log.create_topic("shop.results", P)
    assert await submit(log.publisher(), log.reader(), cmd, P, 0.0) is None
    (sent,) = [r for p in range(P) for r in log.records(BOOK.commands, p)]
    assert decode(CommandEnvelope, sent.value) == cmd


# --- the command line ------------------------------------------------------------------------


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[CommandEnvelope]:
    """What the commands send; each is answered by the code in `ANSWERS` (None: none)."""
    got: list[CommandEnvelope] = []

    async def send(kafka: Connectable, cmd: CommandEnvelope, wait_s: float) -> Any:
        got.append(cmd)
        code = ANSWERS.get(unscoped_request_id(cmd.request_id), ResultCode.COMMITTED)
        if code is None:
            return None
        return CommandResult(
            request_id=cmd.request_id,
            code=code,
            aggregate=cmd.aggregate,
            message="no" if code == "REJECTED" else "",
            version=3,
            decided_at=T0,
        )

    monkeypatch.setattr(app.cli.timer_changes, "send_change", send)
    return got


ANSWERS: dict[str, ResultCode | None] = {
    "dup": ResultCode.DUPLICATE,
    "no": ResultCode.REJECTED,
    "silent": None,
}
SET = [
    "timers",
    "set",
    "--type",
    "shop.reminders",
    "--owner",
    "o-1",
    "--key",
    "k",
    "--target-type",
    "shop.order",
    "--command",
    "RemindToPay",
]


def test_set_sends_the_books_command_and_says_its_answer(sent: list[CommandEnvelope]) -> None:
    result = CliRunner().invoke(
        cli,
        [
            *SET,
            "--rule",
            "interval:15m@2027-01-15T08:00:00Z",
            "--body",
            '{"a": 1}',
            "--request-id",
            "r-9",
            "--target",
            "p-2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "set shop.reminders/(0)/o-1 'k': COMMITTED (request r-9, version 3)\n"
    (cmd,) = sent
    rid = scoped_request_id("set", "k", "r-9")  # the change's own: no other's DUPLICATE
    assert (cmd.type, cmd.request_id, cmd.aggregate.id) == ("wow.SetTimer", rid, "o-1")
    assert cmd.body == {
        "key": "k",
        "rule": {"kind": "interval", "every": 900_000, "start": T0, "coalesce": True},
        "target": {"context": "shop", "aggregate": "order", "tenant": "(0)", "id": "p-2"},
        "command": {"type": "RemindToPay", "body": {"a": 1}},
    }


def test_a_duplicate_is_done_and_a_refusal_or_silence_exits_1(
    sent: list[CommandEnvelope],
) -> None:
    dup = CliRunner().invoke(cli, [*SET, "--rule", "once:0", "--request-id", "dup", "--json"])
    assert dup.exit_code == 0, dup.output
    assert orjson.loads(dup.stdout)["duplicate"] is True
    no = CliRunner().invoke(cli, [*SET, "--rule", "once:0", "--request-id", "no"])
    assert no.exit_code == 1 and no.stderr == "error: set refused: REJECTED no\n"
    silent = CliRunner().invoke(
        cli,
        [
            "timers",
            "cancel",
            "--type",
            "shop.reminders",
            "--owner",
            "o",
            "--key",
            "k",
            "--request-id",
            "silent",
        ],
    )
    assert silent.exit_code == 1
    assert "send it again with --request-id silent" in silent.stderr
    ok = CliRunner().invoke(
        cli, ["timers", "cancel", "--type", "shop.reminders", "--owner", "o", "--key", "k"]
    )
    assert ok.exit_code == 0 and ok.stdout.startswith("cancel shop.reminders/(0)/o 'k': COMMITTED")
    assert [c.type for c in sent] == ["wow.SetTimer"] * 2 + ["wow.CancelTimer"] * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rule", "every:5"], "error: rule 'every:5' is none of"),
        (["--rule", "once:0", "--body", "[1]"], "error: --body: must be a JSON object"),
        (["--rule", "once:0", "--body", "{"], "error: --body is not JSON"),
        (["--rule", "once:0", "--body", '{"a":NaN}'], "error: --body is not JSON"),
        # orjson read it as a float, 1.2e+29, and sent that
        (["--rule", "once:0", "--body", f'{{"a":{10**29}}}'], f"a: integer {10**29} is outside"),
        (["--rule", "once:0", "--target-type", "shop.reminders"], "is the book itself"),
        (["--rule", '{"kind":"once","at":"0"}'], "once.at: Input should be a valid integer"),
        (["--rule", "once:0", "--target", "p\x00"], "--target: Value error, holds the control"),
        (
            ["--rule", '{"kind":"interval","every":1000,"start":0,"count":1}'],
            "error: rule: the rule has no slot left",
        ),
    ],
)
def test_sets_bad_options_exit_2_and_send_nothing(
    sent: list[CommandEnvelope], args: list[str], message: str
) -> None:
    result = CliRunner().invoke(cli, [*SET, *args])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert message in line and not sent


async def test_the_docs_curl_lines_are_answered_as_they_say(edge: Edge) -> None:
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    lines = re.findall(r"^curl -X (?:PUT|DELETE) .*$", text, flags=re.M)
    assert len(lines) == 2
    answers = []
    for line in lines:
        words = shlex.split(line.replace("$TICKWHEEL_WEB_TOKEN", TOKEN))
        method = words[words.index("-X") + 1]
        headers = dict(words[i + 1].split(": ", 1) for i, w in enumerate(words) if w == "-H")
        body = words[words.index("-d") + 1] if "-d" in words else None
        url = URL(words[-1])
        assert (url.host, url.port) == ("127.0.0.1", 8080)
        answers.append(await edge.call(method, url.raw_path, body, token=None, headers=headers))
    (put_status, put), (delete_status, delete) = answers
    assert (put_status, put["code"], put["request_id"]) == (200, "COMMITTED", "pay-o-42-1")
    assert (delete_status, delete["code"], delete["request_id"]) == (200, "COMMITTED", "pay-o-42-2")
    assert (put["key"], put["owner"]["id"]) == ("pay", "o-42")
    (event,) = events(edge.log, BOOK, "wow.ScheduleSet")
    assert event.body["rule"]["at"] == 1_798_102_800_000
    assert event.body["command"] == {"type": "RemindToPay", "body": {"level": 1}}


async def test_a_jittered_timer_is_due_at_its_slot_plus_its_offset(edge: Edge) -> None:
    body = put_body(T0 + 1_000, rule={"kind": "once", "at": T0 + 1_000, "jitter": 5_000})
    status, answer = await edge.call("PUT", "/timers/shop.reminders/o-4/spread", body)
    assert status == 200, answer
    status, shown = await edge.call("GET", "/timers/shop.reminders/o-4/spread")
    assert status == 200, shown
    assert shown["rule"]["jitter"] == 5_000 and shown["slot_due_at"] == T0 + 1_000
    assert shown["due_at"] == T0 + 1_000 + jitter_offset(f"{shown['id']}#0", 5_000)
    edge.clock.set(shown["due_at"] - 1)
    assert (await edge.call("GET", "/timers/shop.reminders/o-4/spread"))[1]["status"] == "PENDING"
    edge.clock.set(shown["due_at"])
    await until(lambda: [t.status for t in rows(edge.log)] == [TimerStatus.FIRED])


async def test_a_timer_shown_after_a_failed_attempt_says_why_it_did_not_fire(edge: Edge) -> None:
    """#22: the row's last error, as the target answered it, in the GET and its schema."""
    body = put_body(T0 + 1_000, command={"type": "NoSuchCommand"})
    assert (await edge.call("PUT", "/timers/shop.reminders/o-5/broken", body))[0] == 200
    await until(lambda: len(rows(edge.log)) == 1)
    edge.clock.set(T0 + 1_000)
    await until(lambda: [t.outcome for t in rows(edge.log)] == ["FAILED"])
    status, shown = await edge.call("GET", "/timers/shop.reminders/o-5/broken")
    assert status == 200, shown
    assert (shown["status"], shown["attempts"]) == ("PENDING", 1)
    assert shown["error_code"] == "ERROR"
    assert shown["error_text"] == "shop.order has no handler for NoSuchCommand"
    _, doc = await edge.call("GET", "/openapi.json", token=None)
    described = doc["components"]["schemas"]["Timer"]["properties"]
    assert {"error_code", "error_text"} <= set(described)


def test_set_passes_the_jitter_in_the_rule(sent: list[CommandEnvelope]) -> None:
    result = CliRunner().invoke(cli, [*SET, "--rule", "cron:0 9 * * *", "--jitter", "90s"])
    assert result.exit_code == 0, result.output
    assert sent[0].body["rule"]["jitter"] == 90_000


async def test_a_broker_that_does_not_take_the_change_is_a_503_with_its_request_id(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def away(*args: Any, **kw: Any) -> None:
        raise KafkaUnavailable("broker away")

    monkeypatch.setattr(app.ops.timer_routes, "submit", away)
    status, answer = await edge.call(
        "PUT", "/timers/shop.reminders/o-5/k", put_body(T0 + 1, request_id="r-5")
    )
    assert status == 503 and answer["request_id"] == "r-5", answer
    assert "send it again with the same request id" in answer["error"]


async def test_a_request_id_in_the_body_and_another_in_the_header_is_a_400(edge: Edge) -> None:
    status, answer = await edge.call(
        "PUT",
        "/timers/shop.reminders/o-6/k",
        put_body(T0 + 1, request_id="a"),
        headers={"Idempotency-Key": "b"},
    )
    assert (status, answer["field"]) == (400, "request_id")
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))


@pytest.mark.parametrize("bad", ["", " ", " r-1", "r-1 ", "r\n1", "r\x1b[2J", "r\x00"])
async def test_a_blank_padded_or_control_character_request_id_is_a_400_sending_nothing(
    edge: Edge, bad: str
) -> None:
    """On every write route, as the CLI's `--request-id` check: a blank one was taken for
    none (a fresh id), so the request sent again made a second change."""
    path = "/timers/shop.reminders/o-7/k"
    answers = [
        await edge.call("PUT", path, put_body(T0 + 1, request_id=bad)),
        await edge.call("DELETE", path, params={"request_id": bad}),
        await edge.call("POST", f"{path}/pause", params={"request_id": bad}),
    ]
    if bad.strip() == "":  # HTTP trims a header's spaces; it holds no control character
        answers.append(await edge.call("DELETE", path, headers={"Idempotency-Key": bad}))
    for status, answer in answers:
        assert (status, answer.get("field")) == (400, "request_id"), answer
    assert all(edge.log.records(BOOK.commands, p) == [] for p in range(P))
