"""The faust client without a broker: what it sends where, what it reads, how it answers,
and the timer book that decides its commands (README "faust apps")."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust
import pytest
from fakes import sent_base
from faust.exceptions import ValueDecodeError
from faust.types import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement

from app.clients.book_commands import scoped_request_id
from app.clients.faust_client import TickwheelTimers, command_of, request_id_for
from app.clients.timer_book import (
    CANCEL_TIMER,
    PAUSE_TIMER,
    RESUME_TIMER,
    SET_TIMER,
    TRIGGER_TIMER,
    timer_book,
)
from app.errors import ConfigError
from app.model.aggregate import send_fits
from app.model.decide import CLOCK_SKEW_MS, StoredAggregate, decide
from app.ops.timer_api import key_command, owner_ref
from app.protocol.dead_letters import DeadLetter, Stage
from app.protocol.topics import AggregateTopics
from app.protocol.wire import (
    SCHEDULE_CANCELLED,
    SCHEDULE_SET,
    CommandEnvelope,
    CommandResult,
    ResultCode,
    ScheduleSet,
    decode,
    encode,
)
from app.timers.subscription import PutTimer, timer_op
from tables import DEFAULT_TENANT, AggregateRef, CommandSpec, OnceRule
from tables.partitioner import partition_of

ROOT = Path(__file__).resolve().parents[2]
P = 6
NOW = 1_700_000_000_000
CTX = "rem"


SENT_HEADERS: list[list[tuple[str, bytes]]] = []
"""The headers of each record a FakeChannel sent, in order (cleared by `sent`)."""


class FakeChannel:
    """A faust topic as the client uses one: records what is sent; acked at once."""

    def __init__(self, name: str, sent: list[tuple[str, int, bytes, bytes]]) -> None:
        self.name = name
        self.sent = sent

    async def send(
        self,
        *,
        key: bytes,
        value: bytes,
        partition: int,
        force: bool = False,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[None]:
        self.sent.append((self.name, partition, key, value))
        SENT_HEADERS.append(list(headers or ()))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
def app() -> faust.App:
    # Nothing connects: a faust app does so only when started.
    return faust.App("unit-faust-client", broker="kafka://broker.invalid:9092")


@pytest.fixture
def sent(app: faust.App, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bytes, bytes]]:
    """What the client and its command topic send, by (topic, partition, key, value)."""
    records: list[tuple[str, int, bytes, bytes]] = []
    SENT_HEADERS.clear()

    def topic(name: str, **kwargs: Any) -> FakeChannel:
        return FakeChannel(name, records)

    monkeypatch.setattr(app, "topic", topic)
    return records


@pytest.fixture
def timers(app: faust.App, monkeypatch: pytest.MonkeyPatch) -> TickwheelTimers:
    t = TickwheelTimers(
        app, context=CTX, book="order-timers", target="order", partitions=P, now=lambda: NOW
    )
    made: list[bool] = []

    async def ensure() -> None:  # the topics are the broker's business (integration test)
        made.append(True)

    monkeypatch.setattr(t.topology, "ensure", ensure)
    return t


def message(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
) -> Message:
    return Message(topic, partition, offset, NOW / 1000, 0, None, key, value, None)


# --- the extra ------------------------------------------------------------------------------


def test_without_faust_the_import_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "app.clients.faust_client")
    monkeypatch.setitem(sys.modules, "faust", None)
    with pytest.raises(ImportError, match=re.escape("pip install '.[faust]'")):
        importlib.import_module("app.clients.faust_client")


def test_the_workers_service_of_the_example_needs_no_faust(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("examples.reminders_service", "app.clients.timer_book"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "faust", None)
    module = importlib.import_module("examples.reminders_service")
    assert [a.type_name for a in module.service.aggregates] == ["reminders.order-timers"]


def test_only_the_client_imports_faust() -> None:
    importing = sorted(
        str(path.relative_to(ROOT))
        for folder in ("app", "tables")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"^\s*(import|from) (faust|mode)\b", path.read_text(), flags=re.M)
    )
    assert importing == ["app/clients/faust_client.py"]


def test_the_extra_takes_a_range_and_the_constraints_pin_the_installed_faust() -> None:
    """faust-streaming and aiokafka as ranges a team can install beside its own packages,
    the exact pair CI tests in constraints.txt, installed by the tests' virtualenv."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (faust_range,) = project["optional-dependencies"]["faust"]
    (aiokafka_range,) = [d for d in project["dependencies"] if d.startswith("aiokafka")]
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for requirement in (faust_range, aiokafka_range):
        wanted = Requirement(requirement)
        installed = importlib.metadata.version(wanted.name)
        assert pins[wanted.name] == installed
        assert wanted.specifier.contains(installed), (requirement, installed)
    assert "'.[dev,faust]'" in (ROOT / "scripts" / "bootstrap-venv").read_text()


def test_the_docs_example_code_is_the_example_app() -> None:
    """docs/faust.md's code is examples/faust_app.py's; its command lines are the README's
    "faust apps" ones, which tests/integration/test_faust_client.py runs; its install
    line names the extra pyproject.toml declares, from a clone (no release on PyPI)."""
    page = (ROOT / "docs" / "faust.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert code in (ROOT / "examples" / "faust_app.py").read_text()

    def started(text: str) -> list[str]:
        blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
        return [
            line
            for block in blocks
            for line in block.splitlines()
            if line.startswith(("tickwheel worker", "python -m"))
        ]

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## faust apps\n", 1)[1].split("\n## ", 1)[0]
    assert started(page) == started(section) and len(started(page)) == 2
    installs = re.findall(r"pip install '\.\[(\w+)\]'", page + section)
    assert installs and set(installs) == {"faust"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "faust" in project["optional-dependencies"]
    assert "tickwheel[faust]" not in page + readme, "there is no release to install by name"


# --- scheduling: key, partition, version (by the book), request id --------------------------


# any text but a control character, which the book refuses (`tables.refs`)
_KEYS = st.characters(exclude_categories=["Cs"], exclude_characters=[*map(chr, range(32)), "\x7f"])


@settings(max_examples=50, deadline=None)
@given(key=st.text(_KEYS, min_size=1, max_size=60))
def test_a_timer_goes_to_the_books_command_topic_in_its_keys_murmur2_partition(key: str) -> None:
    records: list[tuple[str, int, bytes, bytes]] = []
    app = faust.App("unit-faust-client-h", broker="kafka://broker.invalid:9092")
    # The fake for the app's topic factory, as the `sent` fixture's (no fixture under @given).
    vars(app)["topic"] = lambda name, **kw: FakeChannel(name, records)
    t = TickwheelTimers(app, context=CTX, book="order-timers", target="order", partitions=P)
    t.topology._made = True  # no broker: the topics count as made
    rule = OnceRule(at=NOW + 1000)
    asyncio.run(t.schedule(key, "reminder", rule, CommandSpec(type="Remind"), request_id="r"))
    ((topic, partition, raw_key, value),) = records
    assert (topic, partition, raw_key) == (
        f"{CTX}.order-timers.commands",
        partition_of(key, P),
        key.encode(),
    )
    cmd = decode(CommandEnvelope, value)
    assert cmd.aggregate == AggregateRef(context=CTX, aggregate="order-timers", id=key)
    body = ScheduleSet.model_validate(cmd.body)
    assert body.target == AggregateRef(context=CTX, aggregate="order", id=key)
    # The caller's id, scoped to the change it names (another change under it is no
    # DUPLICATE of this one).
    rid = scoped_request_id("set", "reminder", "r")
    assert (cmd.type, body.key, body.rule, cmd.request_id) == (SET_TIMER, "reminder", rule, rid)


async def test_cancel_sends_the_books_cancel_command(
    timers: TickwheelTimers, sent: list[tuple[str, int, bytes, bytes]]
) -> None:
    cmd = await timers.cancel("o-1", "reminder", request_id="c-1")
    ((topic, partition, key, value),) = sent
    assert (topic, partition, key) == (
        f"{CTX}.order-timers.commands",
        partition_of("o-1", P),
        b"o-1",
    )
    assert decode(CommandEnvelope, value) == cmd
    assert (cmd.type, cmd.body, cmd.issued_at) == (CANCEL_TIMER, {"key": "reminder"}, NOW)


def test_the_request_id_is_the_events_so_a_replay_is_a_duplicate() -> None:
    m = message("rem.orders", 2, 41, b"o-1", b"{}")
    rid = request_id_for("set", "reminder", m)
    assert rid == "rem.orders[2]@41:set:reminder"
    assert request_id_for("set", "reminder", message("rem.orders", 2, 41, b"o-1", b"")) == rid
    assert request_id_for("cancel", "reminder", m) != rid
    assert request_id_for("set", "other", m) != rid
    long = request_id_for("set", "k" * 200, message("t" * 200, 0, 0, None, None))
    assert long.startswith("sha256:") and len(long) <= 300


async def test_outside_an_agent_a_request_id_must_be_given(
    timers: TickwheelTimers, sent: list[tuple[str, int, bytes, bytes]]
) -> None:
    with pytest.raises(ValueError, match="pass request_id="):
        await timers.schedule("o-1", "reminder", OnceRule(at=NOW), CommandSpec(type="Remind"))
    assert sent == []


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            lambda t: t.schedule(
                "o-1",
                "r",
                OnceRule(at=NOW),
                CommandSpec(type="Remind"),
                target=AggregateRef(context=CTX, aggregate="order-timers", id="o-1"),
                request_id="x",
            ),
            "is the book itself",
        ),
        (
            lambda t: t.schedule(
                "o-1", "k" * 201, OnceRule(at=NOW), CommandSpec(type="Remind"), request_id="x"
            ),
            "at most 200 characters",
        ),
        (lambda t: t.cancel("o-1", "", request_id="x"), "at least 1 character"),
        # a name with a control character, which the book's node refuses
        (lambda t: t.cancel("o\x00", "k", request_id="x"), "control character U[+]0000"),
        (
            lambda t: t.schedule(
                "o-1", "k\n", OnceRule(at=NOW), CommandSpec(type="Remind"), request_id="x"
            ),
            "control character U[+]000A",
        ),
    ],
)
async def test_bad_input_is_refused_before_anything_is_sent(
    timers: TickwheelTimers,
    sent: list[tuple[str, int, bytes, bytes]],
    call: Callable[[TickwheelTimers], Any],
    error: str,
) -> None:
    with pytest.raises(ValueError, match=error):
        await call(timers)
    assert sent == []


WORKERS = "TICKWHEEL_PARTITIONS"


@pytest.mark.parametrize(
    ("kwargs", "error", "kind"),
    [
        ({"context": "a b"}, "must be '<context>.<aggregate>'", ConfigError),
        ({"book": "order"}, "must not be the book", ValueError),
        ({"context": 5}, "must be strings", ConfigError),
        *(  # 12.0 or True went on into the topics' specs and every record's partition
            (
                {"partitions": p},
                f"an integer from 1 to 1024 (the workers' {WORKERS}), got {p!r}",
                ConfigError,
            )
            for p in [0, -1, 12.0, 12.5, True, "12", None, 1025, 10**30]
        ),
    ],
)
def test_a_client_of_bad_names_or_counts_is_refused(
    app: faust.App, kwargs: dict[str, Any], error: str, kind: type[Exception]
) -> None:
    args: dict[str, Any] = {"context": CTX, "book": "order-timers", "target": "order"}
    with pytest.raises(kind, match=re.escape(error)):
        TickwheelTimers(app, **{"partitions": P, **args, **kwargs})


def test_the_client_makes_the_books_topics_and_its_command_topic(timers: TickwheelTimers) -> None:
    names = {s.name: s.partitions for s in timers.topology.specs}
    assert names[f"{CTX}.order-timers.commands"] == P
    assert names[f"{CTX}.order-timers.events"] == P
    assert names[f"{CTX}.order.commands"] == P
    assert names[f"{CTX}.results"] == P
    assert f"{CTX}.order.events" not in names  # the app's own type keeps no log here


# --- the commands topic: typed values, bad records dead-lettered ----------------------------


def command(key: str = "o-1", **update: Any) -> CommandEnvelope:
    cmd = CommandEnvelope(
        request_id="tid#0",
        type="reminders.Remind",
        aggregate=AggregateRef(context=CTX, aggregate="order", id=key),
        not_before=NOW,
        issued_at=NOW,
        reply_to=f"{CTX}.results",
        reply_partition=4,
    )
    return cmd.model_copy(update=update)


def test_a_command_record_reads_as_a_command_envelope() -> None:
    target = AggregateTopics(CTX, "order")
    cmd = command()
    m = message(target.commands, partition_of("o-1", P), 7, b"o-1", encode(cmd))
    assert command_of(m, target, P) == cmd


@pytest.mark.parametrize(
    ("key", "value", "partition", "error"),
    [
        (b"o-1", b"{not json", None, "not a valid CommandEnvelope"),
        (b"o-1", None, None, "empty record"),
        (
            b"o-1",
            encode(command(aggregate=AggregateRef(context=CTX, aggregate="other", id="o-1"))),
            None,
            f"command for {CTX}.other on {CTX}.order.commands",
        ),
        (b"o-2", encode(command()), None, "is not the aggregate id"),
        (b"o-1", encode(command()), (partition_of("o-1", P) + 1) % P, "belongs in partition"),
    ],
)
def test_a_record_that_is_not_its_aggregates_command_is_a_decode_error(
    key: bytes, value: bytes | None, partition: int | None, error: str
) -> None:
    target = AggregateTopics(CTX, "order")
    p = partition_of("o-1", P) if partition is None else partition
    with pytest.raises(ValueDecodeError, match=re.escape(error)):
        command_of(message(target.commands, p, 0, key, value), target, P)


async def test_the_agents_topic_delivers_commands_and_dead_letters_the_rest(
    timers: TickwheelTimers, sent: list[tuple[str, int, bytes, bytes]]
) -> None:
    topic = f"{CTX}.order.commands"
    p = partition_of("o-1", P)
    event = await timers.commands.decode(message(topic, p, 3, b"o-1", encode(command())))
    assert (event.key, event.value) == ("o-1", command())
    assert sent == []
    await timers.commands.decode(message(topic, p, 4, b"o-1", b"{not json"))
    ((letters, partition, key, value),) = sent
    assert (letters, partition, key, value) == (f"{CTX}.dead-letters", 0, b"o-1", b"{not json")
    letter = DeadLetter.read(key, value, SENT_HEADERS[-1])
    assert (letter.topic, letter.partition, letter.offset, letter.context.stage) == (
        topic,
        p,
        4,
        Stage.READ,
    )
    assert "not a valid CommandEnvelope" in letter.error


async def test_the_topic_is_declared_with_tickwheels_specs(
    app: faust.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[list[tuple[str, int]]] = []

    async def ensure_topics(bootstrap: str, specs: Any, replication: Any = None) -> None:
        made.append([(s.name, s.partitions) for s in specs])
        assert bootstrap == "broker.invalid:9092"

    # the admin port's call, on the clients the client makes from the app's brokers
    monkeypatch.setattr("app.kafka.clients.ensure_topics", ensure_topics)
    t = TickwheelTimers(app, context=CTX, book="order-timers", target="order", partitions=P)
    assert t.commands.internal  # faust declares it before it subscribes
    await t.commands.maybe_declare()
    await t.commands.maybe_declare()
    await t.topology.ensure()
    assert made == [[(s.name, s.partitions) for s in t.topology.specs]]  # once per process


# --- answering ------------------------------------------------------------------------------


async def test_an_answer_goes_to_reply_to_in_the_partition_the_node_reads(
    timers: TickwheelTimers, sent: list[tuple[str, int, bytes, bytes]]
) -> None:
    assert await timers.answer(command(), message="done")
    ((topic, partition, key, value),) = sent
    assert (topic, partition, key) == (f"{CTX}.results", 4, b"tid#0")
    result = decode(CommandResult, value)
    assert (result.code, result.message, result.decided_at) == (ResultCode.COMMITTED, "done", NOW)
    assert result.aggregate == command().aggregate


@pytest.mark.parametrize(
    "reply",
    [
        {"reply_to": "other.results"},
        {"reply_to": "payments.events"},  # another team's topic
        {"reply_partition": 4095},  # a partition the results topic does not have
    ],
)
async def test_an_answer_goes_to_the_own_results_topic_whatever_reply_to_says(
    timers: TickwheelTimers, sent: list[tuple[str, int, bytes, bytes]], reply: dict[str, Any]
) -> None:
    """A command's reply address is its writer's word: followed, the app wrote results
    into any topic, or failed its commit on a partition the topic lacks (and answered the
    same command again after each restart). As a node, it answers on its context's
    results topic only, in the partition of the request id when the given one is not."""
    await timers.answer(command(**reply), ResultCode.REJECTED, "no")
    ((topic, partition, _, value),) = sent
    assert (topic, partition) == (f"{CTX}.results", partition_of("tid#0", P))
    assert decode(CommandResult, value).code == ResultCode.REJECTED


async def test_a_command_without_reply_to_expects_no_answer(
    timers: TickwheelTimers, sent: list[tuple[str, int, bytes, bytes]]
) -> None:
    assert not await timers.answer(command(reply_to=None))
    assert sent == []


def test_early_by_counts_by_the_apps_clock(timers: TickwheelTimers) -> None:
    assert timers.early_by(command(not_before=NOW + 250)) == 250
    assert timers.early_by(command(not_before=NOW - 250)) == 0
    assert timers.early_by(command(not_before=None)) == 0


def test_early_by_takes_a_send_no_sender_waits_for_as_due_within_the_skew(
    timers: TickwheelTimers,
) -> None:
    """Another context's timer (no `reply_to`): answered SCHEDULE_NOT_DUE, nothing would
    send it again. Early within the clocks' skew, it is due, as a node decides it."""
    unanswered = command(reply_to=None, reply_partition=None, not_before=NOW + CLOCK_SKEW_MS)
    assert timers.early_by(unanswered) == 0
    assert timers.early_by(unanswered, skew_ms=100) == CLOCK_SKEW_MS
    later = unanswered.model_copy(update={"not_before": NOW + CLOCK_SKEW_MS + 1})
    assert timers.early_by(later) == CLOCK_SKEW_MS + 1


# --- the timer book: the commands become the events, at the book's versions -----------------


def book_command(type_: str, body: dict[str, Any], request_id: str = "r1") -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id,
        type=type_,
        aggregate=AggregateRef(context=CTX, aggregate="order-timers", id="o-1"),
        body=body,
        issued_at=NOW,
    )


SET_BODY = {
    "key": "reminder",
    "rule": {"kind": "once", "at": NOW + 5000},
    "target": {"context": CTX, "aggregate": "order", "id": "o-1"},
    "command": {"type": "reminders.Remind", "body": {"order_id": "o-1"}},
}


def test_the_book_sets_a_timer_whose_rule_ends_with_its_end() -> None:
    rule = {"kind": "interval", "start": NOW, "every": 1000, "until": NOW + 2500, "count": 9}
    book = timer_book(CTX, "order-timers")
    d = decide(book, None, book_command(SET_TIMER, {**SET_BODY, "rule": rule}), now=NOW, seen=False)
    assert d.code == ResultCode.COMMITTED
    ((event,),) = [d.events]
    assert event.body["rule"] == {**rule, "coalesce": True}
    op = timer_op(event, partition_of("o-1", P))
    assert isinstance(op, PutTimer)
    assert (op.timer.rule.until, op.timer.rule.count) == (NOW + 2500, 9)  # type: ignore[union-attr]
    assert op.timer.due_at == NOW


def test_the_book_decides_set_and_cancel_into_the_events_at_its_next_versions() -> None:
    book = timer_book(CTX, "order-timers")
    first = decide(book, None, book_command(SET_TIMER, SET_BODY), now=NOW, seen=False)
    assert first.code == ResultCode.COMMITTED
    ((event,),) = [first.events]
    assert (event.type, event.version, event.request_id) == (SCHEDULE_SET, 1, "r1")
    assert ScheduleSet.model_validate(event.body) == ScheduleSet.model_validate(SET_BODY)
    op = timer_op(event, partition_of("o-1", P))
    assert isinstance(op, PutTimer)
    assert op.timer.target == AggregateRef(context=CTX, aggregate="order", id="o-1")
    assert op.timer.due_at == NOW + 5000

    second = decide(
        book,
        first.stored,
        book_command(CANCEL_TIMER, {"key": "reminder"}, "r2"),
        now=NOW,
        seen=False,
    )
    ((cancel,),) = [second.events]
    assert (cancel.type, cancel.version, cancel.body) == (
        SCHEDULE_CANCELLED,
        2,
        {"key": "reminder"},
    )
    again = decide(book, second.stored, book_command(SET_TIMER, SET_BODY), now=NOW, seen=True)
    assert again.code == ResultCode.DUPLICATE


@pytest.mark.parametrize(
    ("type_", "body", "reason"),
    [
        (SET_TIMER, {**SET_BODY, "rule": {"kind": "once"}}, "invalid wow.SetTimer: rule.once.at"),
        (SET_TIMER, {k: v for k, v in SET_BODY.items() if k != "target"}, "needs a target"),
        (
            SET_TIMER,
            {**SET_BODY, "target": {"context": CTX, "aggregate": "order-timers", "id": "x"}},
            "is the book itself",
        ),
        (CANCEL_TIMER, {}, "invalid wow.CancelTimer: key"),
        (
            SET_TIMER,
            {**SET_BODY, "rule": {"kind": "interval", "start": 0, "every": 1000, "count": 3}},
            f"the rule has no slot left at {NOW} (it ended: {{'count': 3}})",
        ),
        (
            SET_TIMER,
            {**SET_BODY, "rule": {"kind": "cron", "expr": "* * * * *", "until": NOW - 1}},
            f"the rule has no slot left at {NOW} (it ended: {{'until': {NOW - 1}}})",
        ),
        (
            SET_TIMER,
            {
                **SET_BODY,
                "rule": {"kind": "interval", "start": 0, "every": 1000, "until": 253402300800000},
            },
            "invalid wow.SetTimer: rule.interval.until",
        ),
    ],
)
def test_the_book_rejects_what_is_not_a_timer_for_another_type(
    type_: str, body: dict[str, Any], reason: str
) -> None:
    book = timer_book(CTX, "order-timers")
    stored = StoredAggregate(version=3)
    d = decide(book, stored, book_command(type_, body), now=NOW, seen=False)
    assert d.code == ResultCode.REJECTED and d.events == [] and d.stored is None
    assert reason in d.message, d.message


# --- pause, resume, trigger: the book's commands on one timer, as the CLI and HTTP send them --


ACTIONS = {"pause": PAUSE_TIMER, "resume": RESUME_TIMER, "trigger": TRIGGER_TIMER}


@pytest.mark.parametrize("action", sorted(ACTIONS))
async def test_pause_resume_and_trigger_send_the_books_command_in_the_keys_partition(
    timers: TickwheelTimers, sent: list[tuple[str, int, bytes, bytes]], action: str
) -> None:
    cmd = await getattr(timers, action)("o-1", "reminder", request_id=f"{action}-1")
    ((topic, partition, key, value),) = sent
    assert (topic, partition, key) == (
        f"{CTX}.order-timers.commands",
        partition_of("o-1", P),
        b"o-1",
    )
    assert decode(CommandEnvelope, value) == cmd
    assert (cmd.type, cmd.body, cmd.request_id, cmd.issued_at) == (
        ACTIONS[action],
        {"key": "reminder"},
        scoped_request_id(action, "reminder", f"{action}-1"),
        NOW,
    )
    # The very command `tickwheel timers <action>` and POST .../<action> send for that
    # request id, so the book decides it the same way.
    owner = owner_ref(f"{CTX}.order-timers", "o-1", DEFAULT_TENANT)
    assert cmd == key_command(action, owner, "reminder", f"{action}-1", NOW)


async def test_in_an_agent_each_action_has_the_events_own_request_id(
    timers: TickwheelTimers,
    sent: list[tuple[str, int, bytes, bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processing = message("rem.orders", 2, 41, b"o-1", b"{}")
    event = type("Event", (), {"message": processing})()
    monkeypatch.setattr("app.clients.faust_client.current_event", lambda: event)
    ids = [(await getattr(timers, a)("o-1", "reminder")).request_id for a in sorted(ACTIONS)]
    assert ids == [f"rem.orders[2]@41:{a}:reminder" for a in sorted(ACTIONS)]
    assert [decode(CommandEnvelope, r[3]).request_id for r in sent] == ids
    # A trigger's long derived id is hashed short enough for the command the book sends.
    long = message("t" * 277, 0, 0, None, None)  # 299 characters for a trigger
    assert not send_fits(f"{long.topic}[0]@0:trigger:reminder")
    rid = request_id_for("trigger", "reminder", long)
    assert rid.startswith("sha256:") and send_fits(rid)
    assert request_id_for("pause", "reminder", long) == f"{long.topic}[0]@0:pause:reminder"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda t: t.pause("o-1", "reminder"), "pass request_id="),
        (lambda t: t.resume("o-1", "", request_id="x"), "at least 1 character"),
        (lambda t: t.trigger("o-1", "reminder", request_id="r" * 299), "at most 298 characters"),
        (lambda t: t.key_command("stop", "o-1", "reminder", request_id="x"), "not one of"),
    ],
)
async def test_a_bad_action_is_refused_before_anything_is_sent(
    timers: TickwheelTimers,
    sent: list[tuple[str, int, bytes, bytes]],
    call: Callable[[TickwheelTimers], Any],
    error: str,
) -> None:
    with pytest.raises(ValueError, match=error):
        await call(timers)
    assert sent == []


def test_the_book_answers_the_clients_actions_as_the_clis(timers: TickwheelTimers) -> None:
    """Set, pause, pause again, trigger, resume, resume again, a replay, an unknown key:
    COMMITTED, UNCHANGED (nothing written), DUPLICATE, REJECTED, as the book answers any."""
    book = timers.book
    rule, spec = OnceRule(at=NOW + 60_000), CommandSpec(type="reminders.Remind")
    stored = decide(
        book, None, timers.set_command("o-1", "r", rule, spec, request_id="s"), now=NOW, seen=False
    ).stored
    answers: list[tuple[str, ResultCode, list[str]]] = []
    for action, rid in [
        ("pause", "p1"),
        ("pause", "p2"),
        ("trigger", "t1"),
        ("resume", "r1"),
        ("resume", "r2"),
    ]:
        d = decide(
            book,
            stored,
            timers.key_command(action, "o-1", "r", request_id=rid),
            now=NOW,
            seen=False,
        )
        stored = d.stored or stored
        answers.append((rid, d.code, [sent_base(c.request_id) for c in d.commands]))
    assert answers == [
        ("p1", ResultCode.COMMITTED, []),
        ("p2", ResultCode.UNCHANGED, []),
        (
            "t1",
            ResultCode.COMMITTED,
            ["t1>0"],
        ),  # the timer's command, sent once now
        ("r1", ResultCode.COMMITTED, []),
        ("r2", ResultCode.UNCHANGED, []),
    ]
    again = timers.key_command("trigger", "o-1", "r", request_id="t1")
    assert decide(book, stored, again, now=NOW, seen=True).code == ResultCode.DUPLICATE
    unknown = timers.key_command("pause", "o-1", "nope", request_id="p3")
    refused = decide(book, stored, unknown, now=NOW, seen=False)
    assert refused.code == ResultCode.REJECTED and "has no timer 'nope'" in refused.message
