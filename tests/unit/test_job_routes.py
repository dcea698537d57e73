"""The web edge's job routes (`GET /jobs`, `POST /jobs/{context}/{job}/trigger|enable|
disable|reschedule|backfill`, #22) on a whole node on the in-memory log with a fake clock:
each action does what `tickwheel jobs` does, a request sent again with its request id
changes nothing more (DUPLICATE), a backfill runs each past slot once under its live
tick's request id, the list reads and creates nothing, writes need the web token, and a
bad request is a 400 naming its field and sends nothing."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fakes import MIN, T0, WEB_TOKEN, FakeClock, WebNode, web_node
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from yarl import URL

from app.errors import BadRecord, KafkaUnavailable
from app.jobs import BACKFILLED, TICKED, Job, JobRun, JobScope, declaration, instance_ids, shard_ref
from app.kafka.memory import MemoryLog
from app.model.aggregate import AggregateType, Command, Decision, Event
from app.ops.job_answers import answer_status
from app.ops.timer_api import DONE
from app.protocol.topics import AggregateTopics
from app.protocol.wire import EventEnvelope, ResultCode, decode
from app.service import Service
from app.timers.runner.options import TimerOptions
from tables import AggregateRef, IntervalRule

P = 2
TOKEN = WEB_TOKEN
CONTEXT = "ops"
REPORTS = AggregateTopics(CONTEXT, "report")
SCHEDULE = AggregateTopics(CONTEXT, "schedule")
TARGET = AggregateRef(context=CONTEXT, aggregate="report", id="r-1")
DAY = 24 * 60 * MIN


class Report(BaseModel):
    runs: int = 0


report = AggregateType(CONTEXT, "report", Report)


@report.command("Run")
def _run(state: Report, cmd: Command, d: Decision) -> None:
    d.emit("Ran", {"slot": cmd.body["slot"], "job": cmd.body["job"]})


@report.applies("Ran")
def _ran(state: Report, e: Event) -> Report:
    return state.model_copy(update={"runs": state.runs + 1})


def _handler(run: JobRun) -> None:
    run.send(TARGET, "Run", {"slot": run.slot, "job": run.job})


MINUTELY = Job("minutely", JobScope.SYSTEM, IntervalRule(start=T0, every=MIN), _handler)
PER_TENANT = Job("per-tenant", JobScope.TENANT, IntervalRule(start=T0, every=MIN), _handler)
SWEEP = Job("sweep", JobScope.SHARDED, IntervalRule(start=T0, every=MIN), _handler)
SERVICE = Service(aggregates=(report,), jobs={CONTEXT: (MINUTELY, PER_TENANT, SWEEP)})


def events(log: MemoryLog, topics: AggregateTopics, type_: str) -> list[EventEnvelope]:
    out = []
    for p in range(P):
        for r in log.records(topics.events, p):
            with contextlib.suppress(BadRecord):
                if (e := decode(EventEnvelope, r.value)).type == type_:
                    out.append(e)
    return out


def runs(log: MemoryLog) -> list[int]:
    return sorted(e.body["slot"] for e in events(log, REPORTS, "Ran"))


def commands_sent(log: MemoryLog) -> int:
    return sum(len(log.records(SCHEDULE.commands, p, committed=False)) for p in range(P))


async def until(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


class Edge(WebNode):
    """The node of `SERVICE` with its web edge (`fakes.web_node`), on a fake clock."""

    async def act(self, action: str, body: Any = None, job: str = "minutely") -> Any:
        status, answer = await self.call("POST", f"/jobs/{CONTEXT}/{job}/{action}", body)
        assert status == 200, answer
        return answer


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[Edge]:
    async with web_node(SERVICE, tmp_path, FakeClock(T0 - 30_000), Edge, partitions=P) as e:
        yield e


def codes(answer: Any) -> list[str]:
    return [o["code"] for o in answer["outcomes"]]


async def test_enable_trigger_disable_and_enable_again_each_once_by_request_id(
    edge: Edge,
) -> None:
    enabled = await edge.act("enable", {"request_id": "enable-1"})
    assert (codes(enabled), enabled["answered"]) == (["COMMITTED"], True)
    # The action's own id (`action_request_id`): "enable-1" reused for a disable is not
    # this enable's DUPLICATE.
    assert enabled["outcomes"][0]["request_id"] == "enable:enable-1"
    # sent again with its request id: written once
    assert codes(await edge.act("enable", {"request_id": "enable-1"})) == ["DUPLICATE"]
    edge.clock.set(T0)  # slot 0 runs live
    await until(lambda: runs(edge.log) == [0])

    trigger = {"request_id": "by-hand"}
    assert codes(await edge.act("trigger", trigger)) == ["COMMITTED"]
    again = await edge.act("trigger", trigger)
    assert (codes(again), again["outcomes"][0]["duplicate"]) == (["DUPLICATE"], True)
    await until(lambda: runs(edge.log) == [-1, 0])  # the triggered run, once

    # the Idempotency-Key header names a request as the body's request_id does
    headers = {"Idempotency-Key": "pause-1"}
    status, paused = await edge.call(
        "POST", f"/jobs/{CONTEXT}/minutely/disable", None, headers=headers
    )
    assert (status, codes(paused)) == (200, ["COMMITTED"]), paused
    status, paused = await edge.call(
        "POST", f"/jobs/{CONTEXT}/minutely/disable", {}, headers=headers
    )
    assert (status, codes(paused)) == (200, ["DUPLICATE"]), paused
    edge.clock.set(T0 + MIN + 30_000)  # paused past slot 1: it is never run
    # a fresh request id when none is given (a repeated enable changes nothing: UNCHANGED)
    assert codes(await edge.act("enable")) == ["COMMITTED"]
    edge.clock.set(T0 + 2 * MIN)  # resumed: slot 2 runs
    await until(lambda: 2 in runs(edge.log))
    assert runs(edge.log) == [-1, 0, 2]

    status, listed = await edge.call("GET", "/jobs?job=minutely&state=true", token=None)
    assert status == 200, listed
    (job,) = listed["jobs"]
    ((instance,),) = [job["instances"]]
    assert instance == {"id": "minutely", "partition": instance["partition"]}
    (state,) = job["state"]
    assert (state["enabled"], state["last_slot"]) == (True, 2)


async def test_reschedule_sets_the_override_and_null_follows_the_default(edge: Edge) -> None:
    await edge.act("enable", {"request_id": "e"})
    body = {"rule": {"every": 2 * MIN}, "request_id": "r-1"}
    assert codes(await edge.act("reschedule", body)) == ["COMMITTED"]
    assert codes(await edge.act("reschedule", body)) == ["DUPLICATE"]
    _, listed = await edge.call("GET", "/jobs?job=minutely&state=1", token=None)
    assert listed["jobs"][0]["state"][0]["override"] == {"every": 2 * MIN}
    assert codes(await edge.act("reschedule", {"rule": None})) == ["COMMITTED"]
    _, listed = await edge.call("GET", "/jobs?job=minutely&state=1", token=None)
    assert listed["jobs"][0]["state"][0]["override"] is None


async def test_instances_are_named_by_tenant_or_partition(edge: Edge) -> None:
    answer = await edge.act(
        "enable", {"tenants": ["acme", "globex"], "request_id": "t"}, job="per-tenant"
    )
    assert [(o["instance"]["tenant"], o["request_id"]) for o in answer["outcomes"]] == [
        ("acme", "enable:t@acme/per-tenant"),
        ("globex", "enable:t@globex/per-tenant"),
    ]
    assert codes(answer) == ["COMMITTED", "COMMITTED"]
    sharded = await edge.act("enable", {"partition": 1}, job="sweep")
    (one,) = sharded["outcomes"]
    assert AggregateRef.model_validate(one["instance"]) == shard_ref(CONTEXT, SWEEP, 1, P)
    every = await edge.act("disable", {}, job="sweep")
    assert len(every["outcomes"]) == P
    # an instance never enabled is refused: 422, the outcome says why
    status, refused = await edge.call("POST", f"/jobs/{CONTEXT}/minutely/trigger", {})
    assert (status, codes(refused)) == (422, ["SCHEDULE_JOB_INVALID"]), refused
    assert "never enabled" in refused["outcomes"][0]["message"]


async def test_a_once_rule_its_nodes_timers_would_expire_is_refused(tmp_path: Path) -> None:
    # The node's own `expires_after` (an hour here): its timer would expire the slot unsent.
    hour = 60 * MIN
    timers = TimerOptions(expires_after=hour)
    async with web_node(SERVICE, tmp_path, FakeClock(T0), Edge, partitions=P, timers=timers) as e:
        late = {"rule": {"kind": "once", "at": T0 - 2 * hour}}
        status, refused = await e.call("POST", f"/jobs/{CONTEXT}/minutely/enable", late)
        assert (status, codes(refused)) == (422, ["SCHEDULE_JOB_INVALID"]), refused
        assert f"expires_after ({hour} ms)" in refused["outcomes"][0]["message"]
        recent = {"rule": {"kind": "once", "at": T0 - hour // 2}}
        assert codes(await e.act("enable", recent)) == ["COMMITTED"]


async def test_a_backfill_runs_each_past_slot_once_and_a_dry_run_sends_nothing(
    edge: Edge,
) -> None:
    await edge.act("enable", {"request_id": "e"})
    edge.clock.set(T0)  # slot 0 runs live
    await until(lambda: runs(edge.log) == [0])
    edge.clock.set(T0 + 3 * MIN + 5)  # the node catches up: slot 3 runs, 1 and 2 do not
    await until(lambda: runs(edge.log) == [0, 3])
    (timer,) = {e.body["timer_id"] for e in events(edge.log, SCHEDULE, TICKED)}
    # ISO 8601 with its offset, or epoch ms, as the CLI takes them
    start = datetime.fromtimestamp(T0 / 1000, UTC).isoformat()
    past: dict[str, Any] = {"from": start, "until": T0 + 3 * MIN}

    sent = commands_sent(edge.log)
    dry = await edge.act("backfill", {**past, "dry_run": True})
    assert dry["dry_run"] and commands_sent(edge.log) == sent
    assert [(o["slot"], o["request_id"], o["code"]) for o in dry["outcomes"]] == [
        (n, f"{timer}#{n}", None) for n in range(4)
    ]
    answer = await edge.act("backfill", past)
    assert codes(answer) == ["DUPLICATE", "COMMITTED", "COMMITTED", "DUPLICATE"]
    assert [o["due_at"] for o in answer["outcomes"]] == [T0 + n * MIN for n in range(4)]
    await until(lambda: runs(edge.log) == [0, 1, 2, 3])
    assert set(codes(await edge.act("backfill", past))) == {"DUPLICATE"}
    assert len(events(edge.log, SCHEDULE, BACKFILLED)) == 2


async def test_the_list_reads_and_creates_nothing(edge: Edge) -> None:
    topics = sorted(edge.log._topics)
    status, listed = await edge.call("GET", "/jobs?state=true", token=None)
    assert status == 200, listed
    assert listed["partitions"] == P
    assert [(j["job"], j["scope"]) for j in listed["jobs"]] == [
        ("minutely", "SYSTEM"),
        ("per-tenant", "TENANT"),
        ("sweep", "SHARDED"),
    ]
    assert [len(j["instances"]) for j in listed["jobs"]] == [1, 1, P]
    assert all(j["state"] == [] for j in listed["jobs"])  # none enabled yet
    assert listed["jobs"][0]["rule"]["every"] == MIN
    status, plain = await edge.call("GET", f"/jobs?context={CONTEXT}", token=None)
    assert status == 200 and all(j["state"] is None for j in plain["jobs"])
    assert sorted(edge.log._topics) == topics and commands_sent(edge.log) == 0


async def test_the_list_finds_a_sharded_jobs_ids_off_the_event_loop(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding a SHARDED job's ids the first time costs about partitions**2 hash calls
    (seconds for 1,024 partitions): GET /jobs, which needs no token, must not run it on the
    loop, where it held up every partition's work."""
    listed_in: list[int] = []

    def recorded(context: str, job: Job, partitions: int) -> set[str]:
        listed_in.append(threading.get_ident())
        return instance_ids(context, job, partitions)

    monkeypatch.setattr("app.ops.job_routes.instance_ids", recorded)
    status, listed = await edge.call("GET", "/jobs?job=sweep", token=None)
    assert status == 200, listed
    assert len(listed["jobs"][0]["instances"]) == P
    assert listed_in and threading.get_ident() not in listed_in


@pytest.mark.parametrize("action", ["trigger", "enable", "disable", "reschedule", "backfill"])
async def test_every_write_needs_the_web_token(edge: Edge, action: str) -> None:
    path = f"/jobs/{CONTEXT}/minutely/{action}"
    status, answer = await edge.call("POST", path, {"rule": None}, token=None)
    assert status == 401 and "web token" in answer["error"], answer
    status, answer = await edge.call("POST", path, {"rule": None}, token="wrong")
    assert status == 401, answer
    assert commands_sent(edge.log) == 0


@pytest.mark.parametrize(
    ("path", "body", "field", "message"),
    [
        ("ops/nope/trigger", {}, "job", "unknown job 'nope' in ops"),
        ("shop/minutely/trigger", {}, "context", "context 'shop' declares no jobs"),
        ("ops/minutely/trigger", b"{not json", "body", "not JSON"),
        ("ops/minutely/trigger", [1], "body", "must be a JSON object"),
        ("ops/minutely/trigger", {"partition": "1"}, "partition", "valid integer"),
        ("ops/minutely/trigger", {"tenants": "acme"}, "tenants", "valid list"),
        ("ops/minutely/trigger", {"request_id": 5}, "request_id", "valid string"),
        ("ops/minutely/trigger", {"request_id": ""}, "request_id", "at least 1 character"),
        ("ops/minutely/trigger", {"colour": "red"}, "colour", "Extra inputs"),
        ("ops/minutely/trigger", {"partition": 0}, "partition", "partition is for SHARDED jobs"),
        ("ops/minutely/trigger", {"tenants": ["acme"]}, "tenants", "; tenants is for TENANT jobs"),
        ("ops/minutely/trigger", {"rule": {"every": 1}}, "rule", "a trigger takes no rule"),
        ("ops/sweep/disable", {"partition": P}, "partition", f"partition {P} is not one of {P}"),
        ("ops/minutely/enable", {"rule": {"every": 0}}, "rule", "invalid rule for job 'minutely'"),
        # a job ticks once a second at most: a millisecond's interval flooded the node
        (
            "ops/minutely/enable",
            {"rule": {"every": 1}},
            "rule",
            "invalid rule for job 'minutely': every 1 ms is shorter than a job's shortest "
            "interval, 1000 ms",
        ),
        (
            "ops/sweep/reschedule",
            {"rule": {"every": 999}},
            "rule",
            "invalid rule for job 'sweep': every 999 ms is shorter",
        ),
        # a once `at` in epoch seconds: in 1970 as ms (`timers set` refuses it too)
        (
            "ops/minutely/enable",
            {"rule": {"kind": "once", "at": 1_733_400_000}},
            "rule",
            "looks like seconds",
        ),
        ("ops/minutely/enable", {"rule": [1]}, "rule", "valid dictionary"),
        ("ops/minutely/reschedule", {}, "rule", "Field required"),
        ("ops/minutely/backfill", {"until": T0}, "from", "Field required"),
        ("ops/minutely/backfill", {"from": "yesterday", "until": T0}, "from", "neither ISO 8601"),
        ("ops/minutely/backfill", {"from": "\u00b2", "until": T0}, "from", "neither ISO 8601"),
        ("ops/minutely/backfill", {"from": T0, "until": "9" * 5000}, "until", "is outside 1970"),
        ("ops/minutely/backfill", {"from": T0, "until": 1.5}, "until", "or epoch ms (an integer)"),
        # orjson read it as a float: "give ... epoch ms (an integer)"
        ("ops/minutely/backfill", b'{"from":0,"until":%d}' % 10**29, "until", "is outside 1970"),
        ("ops/minutely/backfill", {"from": T0 + MIN, "until": T0}, "until", "is before from"),
        ("ops/minutely/backfill", {"from": T0, "until": T0 + DAY}, "until", "is after now"),
        (
            "ops/minutely/backfill",
            {"from": 0, "until": 0, "request_id": "x"},
            "request_id",
            "Extra",
        ),
        # a tenant no instance can have (it was a 500)
        ("ops/per-tenant/enable", {"tenants": ["t" * 201]}, "tenants", "at most 200 characters"),
        ("ops/per-tenant/enable", {"tenants": [""]}, "tenants", "at least 1 character"),
        # no tenant at all: it was the default tenant's instance, one nobody named
        ("ops/per-tenant/trigger", {"tenants": []}, "tenants", "at least 1 item"),
        ("ops/per-tenant/enable", {"tenants": []}, "tenants", "at least 1 item"),
        (
            "ops/per-tenant/backfill",
            {"from": T0 - MIN, "until": T0 - MIN, "tenants": []},
            "tenants",
            "at least 1 item",
        ),
        # `<request id>@<tenant>/<instance>` longer than a request id (it was dead-lettered)
        (
            "ops/per-tenant/enable",
            {"tenants": ["a", "t" * 200], "request_id": "r" * 200},
            "request_id",
            "too long for 2 instances: ops.schedule/" + "t" * 200 + "/per-tenant's would be "
            "419 characters (<action>:<request id>@<tenant>/<instance>, at most 300); give at "
            "most 81",
        ),
        # a triggered run's sends `<id>>n` must fit as well
        (
            "ops/per-tenant/trigger",
            {"tenants": ["a", "t" * 100], "request_id": "r" * 178},
            "request_id",
            "would be 298 characters (<action>:<request id>@<tenant>/<instance>, at most 296); "
            "give at most 176",
        ),
    ],
)
async def test_a_bad_request_is_a_400_naming_its_field_and_sends_nothing(
    edge: Edge, path: str, body: Any, field: str, message: str
) -> None:
    status, answer = await edge.call("POST", f"/jobs/{path}", body)
    assert (status, answer["field"]) == (400, field), answer
    assert message in answer["error"], answer
    assert commands_sent(edge.log) == 0


async def test_ids_made_from_the_longest_request_id_that_fits_are_sent_and_deduplicated(
    edge: Edge,
) -> None:
    tenants = ["a", "t" * 100]
    # len("enable:") + 181 + len("@" + "t" * 100 + "/per-tenant") = 300: a request id's
    # bound, met exactly
    body = {"tenants": tenants, "request_id": "r" * 181}
    answer = await edge.act("enable", body, job="per-tenant")
    assert [len(o["request_id"]) for o in answer["outcomes"]] == [201, 300]
    assert codes(answer) == ["COMMITTED", "COMMITTED"], answer
    assert codes(await edge.act("enable", body, job="per-tenant")) == ["DUPLICATE"] * 2
    # a trigger keeps room for its run's sends: 296, and its run sends and commits once
    body = {"tenants": tenants, "request_id": "r" * 176}
    assert codes(await edge.act("trigger", body, job="per-tenant")) == ["COMMITTED"] * 2
    assert codes(await edge.act("trigger", body, job="per-tenant")) == ["DUPLICATE"] * 2
    await until(lambda: runs(edge.log).count(-1) == 2)


async def test_a_header_and_body_naming_two_request_ids_is_a_400(edge: Edge) -> None:
    status, answer = await edge.call(
        "POST",
        f"/jobs/{CONTEXT}/minutely/trigger",
        {"request_id": "a"},
        headers={"Idempotency-Key": "b"},
    )
    assert (status, answer["field"]) == (400, "request_id"), answer


@pytest.mark.parametrize(
    ("query", "field"),
    [("context=shop", "context"), ("job=nope", "job"), ("state=maybe", "state"), ("x=1", "x")],
)
async def test_a_bad_list_query_is_a_400_naming_it(edge: Edge, query: str, field: str) -> None:
    status, answer = await edge.call("GET", f"/jobs?{query}", token=None)
    assert (status, answer["field"]) == (400, field), answer


async def test_a_backfill_of_too_many_slots_over_its_instances_is_a_400(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each instance's slots were bounded, not a backfill's: 1,024 shards or 1,000 tenants
    of one instance's limit each held ~15 GB of commands in the worker, dry run or not."""
    monkeypatch.setattr("app.ops.job_routes.MAX_BACKFILL_TOTAL_SLOTS", 5, raising=False)
    await edge.act("enable", {"request_id": "e"}, job="sweep")
    edge.clock.set(T0 + 3 * MIN + 5)  # each shard's catch-up tick: slot 3
    await until(lambda: len(events(edge.log, SCHEDULE, TICKED)) == P)
    sent = commands_sent(edge.log)
    past = {"from": T0, "until": T0 + 3 * MIN}  # 4 slots a shard, 2 shards
    for dry_run in (True, False):
        status, answer = await edge.call(
            "POST", f"/jobs/{CONTEXT}/sweep/backfill", {**past, "dry_run": dry_run}
        )
        assert (status, answer["field"]) == (400, "until"), answer
        assert "more than 5 slots over its instances" in answer["error"]
        assert "(from, until) or fewer instances (tenants, partition)" in answer["error"]
    assert commands_sent(edge.log) == sent
    status, one = await edge.call(
        "POST", f"/jobs/{CONTEXT}/sweep/backfill", {**past, "partition": 1, "dry_run": True}
    )
    assert status == 200 and len(one["outcomes"]) == 4, one


async def test_a_range_too_large_or_too_old_is_a_400(edge: Edge) -> None:
    await edge.act("enable", {"request_id": "e"})
    edge.clock.set(T0 + 8 * DAY)  # one catch-up tick: its timer reaches back to T0
    await until(lambda: len(runs(edge.log)) == 1)
    sent = commands_sent(edge.log)
    status, answer = await edge.call(
        "POST", f"/jobs/{CONTEXT}/minutely/backfill", {"from": T0, "until": T0 + 7 * DAY}
    )
    assert (status, answer["field"]) == (400, "until"), answer
    assert "the range has more than 10000 slots: backfill a shorter one" in answer["error"]
    # older than the de-duplication window (7 days) less an hour: it could run twice
    status, answer = await edge.call(
        "POST", f"/jobs/{CONTEXT}/minutely/backfill", {"from": T0, "until": T0 + MIN}
    )
    assert (status, answer["field"]) == (400, "from"), answer
    assert "could run twice" in answer["error"]
    assert commands_sent(edge.log) == sent


@given(st.lists(st.sampled_from([*ResultCode, None]), min_size=1))
def test_an_answers_status_is_200_only_when_every_command_is_done(
    codes: list[ResultCode | None],
) -> None:
    status = answer_status(codes)
    assert (status == 200) == all(c in DONE for c in codes)
    if any(c in (ResultCode.REJECTED, ResultCode.SCHEDULE_JOB_INVALID) for c in codes):
        assert status == 422
    elif status != 200:
        assert status in (422, 502, 503, 504)
    if None in codes and status == 504:
        assert all(c in DONE or c is None for c in codes)


async def test_reads_the_broker_does_not_answer_are_a_503_to_retry(
    edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list's states and a backfill read the schedule's log: with the broker away they
    answer 503 with Retry-After (they were a 500), and nothing is sent."""
    clients = edge.node.clients
    made = clients.reader

    def away() -> Any:
        reader = made()

        async def start() -> None:
            raise KafkaUnavailable("the broker is away")

        reader.start = start  # type: ignore[method-assign]
        return reader

    monkeypatch.setattr(clients, "reader", away)
    sent = commands_sent(edge.log)
    async with edge.http.get(edge.url.with_path("/jobs").with_query(state="true")) as r:
        assert r.status == 503 and r.headers["Retry-After"] == "5"
        assert "the broker is away" in (await r.json())["error"]
    edge.clock.set(T0 + 10 * MIN)  # a past range
    status, answer = await edge.call(
        "POST", f"/jobs/{CONTEXT}/minutely/backfill", {"from": T0, "until": T0 + MIN}
    )
    assert status == 503, answer
    assert commands_sent(edge.log) == sent


async def test_a_query_naming_a_parameter_twice_or_not_utf8_is_a_400(edge: Edge) -> None:
    """Read as its first value, the second was dropped without a word; bytes no UTF-8 were
    decoded to U+FFFD, a tenant no one wrote. The page's own search answers on a page."""
    base = str(edge.url)
    for path, why in (
        ("/jobs?context=ops&context=shop", "context given more than once"),
        ("/timers/upcoming?limit=1&limit=2", "limit given more than once"),
        ("/jobs?context=%ED%A0%80", "not UTF-8"),
    ):
        async with edge.http.get(URL(base + path, encoded=True)) as r:
            assert r.status == 400, path
            assert why in (await r.json())["error"], path
    sent = commands_sent(edge.log)
    put = URL(base + "/timers/ops.report/r-1/k?tenant=%ED%A0%80", encoded=True)
    async with edge.http.put(put, json={}, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 400 and "not UTF-8" in (await r.json())["error"]
    assert commands_sent(edge.log) == sent
    # U+FFFD itself, percent-encoded as UTF-8, is a character like any: the route answers.
    async with edge.http.get(URL(base + "/jobs?context=%EF%BF%BD", encoded=True)) as r:
        assert "UTF-8" not in (await r.json())["error"]


@pytest.mark.parametrize("action", ["enable", "backfill"])
async def test_an_action_finds_a_sharded_jobs_ids_off_the_event_loop(
    edge: Edge, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """The first POST for a SHARDED job found its ids (seconds at 1,024 partitions) on the
    loop as the list did: each is found in a thread, and the action reads the kept ones."""
    found_in: list[int] = []
    first_shard_id = declaration._first_shard_id

    def recorded(job: str, partition: int, partitions: int) -> str:
        found_in.append(threading.get_ident())
        return first_shard_id(job, partition, partitions)

    monkeypatch.setattr(declaration, "_shard_maps", {})
    monkeypatch.setattr(declaration, "_first_shard_id", recorded)
    body: dict[str, object] = {"rule": None} if action == "enable" else {"from": 0, "until": 1}
    status, answer = await edge.call("POST", f"/jobs/{CONTEXT}/sweep/{action}", body)
    assert status < 500, answer
    assert len(found_in) == P and threading.get_ident() not in found_in
