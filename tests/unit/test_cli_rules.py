"""`tickwheel rules next`: the slots it prints are the runner's slot functions' own (and,
independently, the interval arithmetic and cronsim's matches), daylight-saving changes by
example, the docs' example output as printed, and bad input exits 2 with one line."""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from cronsim import CronSim
from fakes import DOCS
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

import app.cli.rules
from app.cli import cli
from app.cli.rule_expr import BadExpression, parse_duration, parse_expr, parse_instant
from tables.bounds import MAX_INSTANT
from tables.rules import CronRule, IntervalRule, OnceRule
from tables.slots import Slot, first_slot, next_slot

Y2026 = 1_767_225_600_000  # 2026-01-01T00:00Z
EXPRESSIONS = ["* * * * *", "*/7 * * * *", "30 2 * * *", "0 9 * * MON-FRI", "0 30 2 * * *"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, ["rules", "next", *args])


def printed(result: Result) -> list[Slot]:
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(line) for line in result.stdout.splitlines()]
    return [Slot(d["index"], d["due_at"]) for d in lines]


def runner_chain(rule: OnceRule | IntervalRule | CronRule, at: int, n: int) -> list[Slot]:
    """What a runner steps through for a timer of `rule` set at `at`: its first slot,
    then next_slot each time (a once rule's past slot is not upcoming)."""
    out: list[Slot] = []
    slot = first_slot(rule, at)
    while slot is not None and len(out) < n:
        if slot.due_at >= at:
            out.append(slot)
        slot = next_slot(rule, slot)
    return out


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 2 * Y2026),
    every=st.integers(1, 10 * 86_400_000),
    after=st.integers(-(10**10), 10**11),
    n=st.integers(1, 6),
)
def test_interval_slots_are_the_runners_and_the_arithmetic(
    start: int, every: int, after: int, n: int
) -> None:
    at = max(0, start + after)
    result = invoke(f"interval:{every}@{start}", "--from", str(at), "-n", str(n), "--json")
    got = printed(result)
    rule = IntervalRule(start=start, every=every)
    assert got == runner_chain(rule, at, n)
    first = max(0, -(-(at - start) // every))
    assert got == [Slot(k, start + k * every) for k in range(first, first + n)]


@settings(max_examples=40, deadline=None)
@given(
    expr=st.sampled_from(EXPRESSIONS),
    zone=st.sampled_from(ZONES),
    at=st.integers(Y2026 - 400 * 86_400_000, Y2026 + 800 * 86_400_000),
    n=st.integers(1, 5),
)
def test_cron_slots_are_the_runners(expr: str, zone: str, at: int, n: int) -> None:
    result = invoke(f"cron:{expr}", "--zone", zone, "--from", str(at), "-n", str(n), "--json")
    got = printed(result)
    assert got == runner_chain(CronRule(expr=expr, zone=zone), at, n)
    assert len(got) == n and [s.index for s in got] == list(range(n))
    assert got[0].due_at >= at
    if zone == "UTC":  # no clock change: cronsim's own iteration is the oracle
        start = datetime.fromtimestamp(-(-at // 1000) - 1, UTC)
        sim = CronSim(expr, start)
        expected = [int(next(sim).timestamp() * 1000) for _ in range(n)]
        assert [s.due_at for s in got] == expected


@settings(max_examples=60, deadline=None)
@given(
    every=st.integers(1, 3_600_000),
    after=st.integers(0, 10**8),
    until=st.none() | st.integers(0, 10**8),
    count=st.none() | st.integers(1, 30),
    n=st.integers(1, 40),
    cron=st.booleans(),
)
def test_until_and_count_end_the_slots_printed_as_the_runners(
    every: int, after: int, until: int | None, count: int | None, n: int, cron: bool
) -> None:
    start = Y2026
    ends = {
        k: v
        for k, v in (("until", None if until is None else start + until), ("count", count))
        if v is not None
    }
    args = [f"--{k}={v}" for k, v in ends.items()]
    expr = "cron:*/5 * * * *" if cron else f"interval:{every}@{start}"
    result = invoke(expr, "--from", str(start + after), "-n", str(n), "--json", *args)
    rule = (
        CronRule(expr="*/5 * * * *", **ends)
        if cron
        else IntervalRule(start=start, every=every, **ends)
    )
    got = printed(result)
    assert got == runner_chain(rule, start + after, n)
    assert all(s.due_at <= ends.get("until", s.due_at) for s in got)
    assert all(s.index < ends.get("count", s.index + 1) for s in got)


@settings(max_examples=30, deadline=None)
@given(at=st.integers(0, MAX_INSTANT), after=st.integers(0, MAX_INSTANT))
def test_a_once_rule_has_its_one_slot_until_it_is_past(at: int, after: int) -> None:
    got = printed(invoke(f"once:{at}", "--from", str(after), "--json"))
    assert got == ([Slot(0, at)] if at >= after else [])


def test_a_json_rule_is_the_wire_formats_own() -> None:
    rule = '{"kind":"cron","expr":"0 9 * * MON-FRI","zone":"America/New_York","start":0}'
    got = printed(invoke(rule, "--from", "2026-12-04T00:00:00Z", "-n", "2", "--json"))
    # Friday the 4th, then Monday the 7th, 09:00 EST (UTC-5)
    assert [s.due_at for s in got] == [
        int(datetime(2026, 12, d, 14, tzinfo=UTC).timestamp() * 1000) for d in (4, 7)
    ]


@pytest.mark.parametrize(
    ("args", "lines"),
    [
        (  # spring forward: 02:30 does not exist on the 29th and fires at 03:00 CEST
            ["cron:30 2 * * *", "--zone", "Europe/Berlin", "--from", "2026-03-28T00:00:00Z"],
            [
                "0\t2026-03-28T01:30:00.000Z\t2026-03-28T02:30:00.000+01:00\tCET",
                "1\t2026-03-29T01:00:00.000Z\t2026-03-29T03:00:00.000+02:00\tCEST",
                "2\t2026-03-30T00:30:00.000Z\t2026-03-30T02:30:00.000+02:00\tCEST",
            ],
        ),
        (  # fall back: 02:30 comes twice on the 25th and fires on the first pass only
            ["cron:30 2 * * *", "--zone", "Europe/Berlin", "--from", "2026-10-24T12:00:00Z"],
            [
                "0\t2026-10-25T00:30:00.000Z\t2026-10-25T02:30:00.000+02:00\tCEST",
                "1\t2026-10-26T01:30:00.000Z\t2026-10-26T02:30:00.000+01:00\tCET",
                "2\t2026-10-27T01:30:00.000Z\t2026-10-27T02:30:00.000+01:00\tCET",
            ],
        ),
        (  # a wall-clock job fires on both passes of the repeated hour
            ["cron:15 * * * *", "--zone", "Europe/Berlin", "--from", "2026-10-25T00:00:00Z"],
            [
                "0\t2026-10-25T00:15:00.000Z\t2026-10-25T02:15:00.000+02:00\tCEST",
                "1\t2026-10-25T01:15:00.000Z\t2026-10-25T02:15:00.000+01:00\tCET",
                "2\t2026-10-25T02:15:00.000Z\t2026-10-25T03:15:00.000+01:00\tCET",
            ],
        ),
        (  # an interval rule is UTC arithmetic; --zone only shows its local times
            [
                "interval:1h@2026-03-29T00:00:00Z",
                "--zone",
                "Europe/Berlin",
                "--from",
                "2026-03-29T00:00:00Z",
            ],
            [
                "0\t2026-03-29T00:00:00.000Z\t2026-03-29T01:00:00.000+01:00\tCET",
                "1\t2026-03-29T01:00:00.000Z\t2026-03-29T03:00:00.000+02:00\tCEST",
                "2\t2026-03-29T02:00:00.000Z\t2026-03-29T04:00:00.000+02:00\tCEST",
            ],
        ),
    ],
)
def test_daylight_saving_changes(args: list[str], lines: list[str]) -> None:
    result = invoke(*args, "-n", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == lines


def test_the_docs_example_prints_what_the_docs_show() -> None:
    text = "\n".join(p.read_text() for p in DOCS)
    found = re.findall(
        r"```sh\n(tickwheel rules next [^\n]*)\n```\n\n```text\n(.*?)```", text, re.S
    )
    assert found, "the docs show no rules next example with its output"
    for command, output in found:
        result = CliRunner().invoke(cli, shlex.split(command)[1:])
        assert result.exit_code == 0, result.output
        assert result.stdout == output


def test_default_from_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.cli.rules, "now_ms", lambda: Y2026 + 1)
    (slot,) = printed(invoke("cron:* * * * *", "-n", "1", "--json"))
    assert slot == Slot(0, Y2026 + 60_000)


def test_json_lines_carry_utc_and_local_times() -> None:
    result = invoke(
        "once:2026-12-24T18:00:00+01:00", "--zone", "Europe/Berlin", "--from", "0", "--json"
    )
    assert orjson.loads(result.stdout) == {
        "index": 0,
        "due_at": 1798131600000,
        "utc": "2026-12-24T17:00:00.000Z",
        "local": "2026-12-24T18:00:00.000+01:00",
        "zone": "Europe/Berlin",
        "offset": "CET",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cron:61 * * * *"], "error: bad rule: cron.expr: Value error, invalid cron expression"),
        (["cron:0 9 * * *", "--zone", "Mars/Base"], "error: unknown time zone 'Mars/Base'"),
        (
            ["cron:0 9 * * *", "--from", "2026-01-01T00:00"],
            "error: --from '2026-01-01T00:00' has no offset",
        ),
        (["cron:0 9 * * *", "--from", "tomorrow"], "error: --from 'tomorrow' is neither ISO 8601"),
        # isdigit() is true of "\u00b2" (int() refuses it) and int() of no 4,301 digits.
        (["cron:0 9 * * *", "--from", "\u00b2"], "error: --from '\u00b2' is neither ISO 8601"),
        (["cron:0 9 * * *", "--from", "9" * 5000], "error: --from '9999999999"),
        (["once:\u00b2"], "error: at '\u00b2' is neither ISO 8601"),
        (["interval:\u00b2"], "error: interval '\u00b2' is neither milliseconds"),
        (["interval:\u0663m"], "error: interval '\u0663m' is neither milliseconds"),
        (["interval:" + "9" * 5000 + "m"], "error: interval '9999999999"),
        (["cron:* * * * *", "--jitter", "\u00b2s"], "error: --jitter '\u00b2s' is neither"),
        (["cron:0 9 * * *", "--from", "10000-01-01T00:00:00Z"], "error: --from '10000-01-01"),
        (["every:15m"], "error: rule 'every:15m' is none of cron:<expression>"),
        (["interval:0"], "error: interval '0' must be at least 1 ms"),
        (["interval:15 minutes"], "error: interval '15 minutes' is neither milliseconds"),
        (["once:2026-12-24"], "error: at '2026-12-24' has no offset"),
        (["{nope"], "error: rule '{nope' is not JSON"),
        (['{"kind":"interval","every":5}'], "error: bad rule: interval.start: Field required"),
        (
            ['{"kind":"cron","expr":"* * * * *","zone":"UTC"}', "--zone", "Asia/Tokyo"],
            "error: the rule's zone 'UTC' and --zone 'Asia/Tokyo' differ",
        ),
        (["cron:* * * * *", "--count", "0"], "Invalid value for '--count'"),
        (["cron:* * * * *", "--until", "soon"], "error: --until 'soon' is neither ISO 8601"),
        (["once:5", "--count", "2"], "error: a once rule has one slot: --count is for recurring"),
        (
            ["interval:1s@2026-01-01T00:00:00Z", "--until", "2025-01-01T00:00:00Z"],
            "error: bad rule: interval: Value error, until 1735689600000 is before the rule",
        ),
        (
            ['{"kind":"cron","expr":"* * * * *","count":3}', "--count", "2"],
            "error: the rule's count 3 and --count 2 differ",
        ),
        (["cron:* * * * *", "-n", "0"], "Invalid value for '-n' / '--slots'"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and message in line, line
    assert result.stdout == ""


def test_a_cron_rules_own_zone_shows_its_local_times() -> None:
    rule = '{"kind":"cron","expr":"0 9 * * *","zone":"Asia/Tokyo"}'
    result = invoke(rule, "--from", "2026-12-01T00:00:00Z", "-n", "1")
    assert result.stdout == "0\t2026-12-01T00:00:00.000Z\t2026-12-01T09:00:00.000+09:00\tJST\n"


@given(
    parts=st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from(["d", "h", "m", "s", "ms"])),
        min_size=1,
        max_size=4,
    )
)
def test_durations(parts: list[tuple[int, str]]) -> None:
    units = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
    text = "".join(f"{n}{u}" for n, u in parts)
    total = sum(n * units[u] for n, u in parts)
    if total == 0:
        with pytest.raises(BadExpression):
            parse_duration(text)
    else:
        assert parse_duration(text) == total


@given(ms=st.integers(0, MAX_INSTANT))
def test_instants_round_trip(ms: int) -> None:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert parse_instant(moment.isoformat()) == ms
    assert parse_instant(str(ms)) == ms


def test_an_interval_without_start_starts_at_from() -> None:
    assert parse_expr("interval:15m", None, 1234) == IntervalRule(start=1234, every=900_000)
    assert parse_expr("once:5", "Europe/Berlin", 0) == OnceRule(at=5)


def test_the_last_instant_in_a_zone_ahead_of_utc_or_with_its_jitter_is_said_in_words() -> None:
    """The last instant a rule takes, shown in a zone 14 h ahead of UTC or fired a day of
    jitter later, is past what a date holds: printed so (it was an OverflowError)."""
    last = str(MAX_INSTANT)
    result = invoke(f"once:{last}", "--zone", "Etc/GMT-14", "--from", "0")
    assert result.exit_code == 0, result.output
    assert "after 9999-12-31" in result.stdout.splitlines()[0]
    result = invoke(f"once:{last}", "--jitter", "1d", "--timer-id", "x", "--from", "0")
    assert result.exit_code == 0, result.output
    assert "fires after 9999-12-31" in result.stdout.splitlines()[0]
