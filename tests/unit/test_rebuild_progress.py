"""The rebuild's replay progress: offsets -> done/total/rate/ETA (pure), the loop that
follows it on a fake clock, and how it is shown on a terminal and elsewhere."""

from __future__ import annotations

import io
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from app.cli.rebuild import ReplayView, format_eta, format_rate, plan_lines, progress_line
from app.errors import KafkaUnavailable
from app.ops.rebuild import (
    PartitionPlan,
    Progress,
    RebuildPlan,
    Sample,
    Span,
    TypePlan,
    follow_replay,
    replay_progress,
)
from app.protocol.topics import AggregateTopics

A0, A1 = ("shop.order.events", 0), ("shop.order.events", 1)
SPANS = {A0: Span(0, 100), A1: Span(10, 310)}


def test_done_counts_each_partitions_committed_offset_within_its_span() -> None:
    p = replay_progress(SPANS, {A0: 40, A1: 60}, None, now=5.0)
    assert (p.done, p.total) == (40 + 50, 100 + 300)
    assert p.rate is None and p.eta is None and not p.complete


def test_nothing_committed_and_offsets_outside_the_span_are_clamped() -> None:
    assert replay_progress(SPANS, {}, None, 0.0).done == 0
    assert replay_progress(SPANS, {A0: None, A1: 0}, None, 0.0).done == 0
    # Past the replay's end: the workers went on with new events; done stops at the total.
    p = replay_progress(SPANS, {A0: 900, A1: 310}, None, 0.0)
    assert p.done == p.total == 400 and p.complete and p.eta == 0.0


def test_rate_and_eta_from_the_sample_the_window_starts_at() -> None:
    p = replay_progress(SPANS, {A0: 100, A1: 110}, Sample(at=10.0, done=100), now=14.0)
    assert p.done == 200
    assert p.rate == pytest.approx(25.0)  # 100 offsets in 4 s
    assert p.eta == pytest.approx(200 / 25.0)


def test_a_stalled_replay_has_a_zero_rate_and_no_eta() -> None:
    p = replay_progress(SPANS, {A0: 50}, Sample(at=1.0, done=50), now=3.0)
    assert p.rate == 0.0 and p.eta is None
    # Two samples at the same instant give no rate rather than a division by zero.
    assert replay_progress(SPANS, {A0: 50}, Sample(3.0, 0), now=3.0).rate is None


def test_an_empty_log_is_replayed_at_once() -> None:
    p = replay_progress({A0: Span(7, 7)}, {}, None, 0.0)
    assert p.complete and (p.done, p.total, p.eta) == (0, 0, 0.0)


@given(
    st.lists(
        st.tuples(st.integers(0, 1000), st.integers(0, 1000), st.none() | st.integers(-1, 3000)),
        min_size=1,
        max_size=6,
    )
)
def test_done_is_within_the_total_and_complete_exactly_when_every_partition_is(
    parts: list[tuple[int, int, int | None]],
) -> None:
    spans = {("t", i): Span(start, start + size) for i, (start, size, _) in enumerate(parts)}
    committed = {("t", i): c for i, (_, _, c) in enumerate(parts)}
    p = replay_progress(spans, committed, None, 0.0)
    assert 0 <= p.done <= p.total
    every = True
    for k, s in spans.items():
        c = committed[k]
        every = every and (s.size == 0 or (c is not None and c >= s.end))
    assert p.complete == every


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_following_reports_until_the_replay_is_complete() -> None:
    clock = FakeClock()
    # What the group has committed at each read: a stall, a failed read, then the end.
    reads: list[Mapping[tuple[str, int], int | None] | Exception] = [
        {},
        {A0: 20},
        {A0: 20},
        KafkaUnavailable("coordinator moved"),
        {A0: 100, A1: 160},
        {A0: 100, A1: 310},
    ]

    async def fetch() -> Mapping[tuple[str, int], int | None]:
        got = reads.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    seen: list[Progress] = []
    last = await follow_replay(
        fetch, SPANS, seen.append, clock=clock, sleep=clock.sleep, interval=1.0, window=2.0
    )
    assert reads == [] and last is seen[-1] and last.complete
    assert [p.done for p in seen] == [0, 20, 20, 250, 400]
    assert seen[0].rate is None
    assert seen[1].rate == pytest.approx(20.0)  # 20 in the 1 s since the first read
    assert seen[2].rate == pytest.approx(10.0) and seen[2].eta == pytest.approx(38.0)
    # The failed read cost a second; the window (2 s) now starts at the read at 102 s.
    assert seen[3].rate == pytest.approx((250 - 20) / 2)
    assert last.eta == 0.0


def _line_view(clock: FakeClock) -> tuple[ReplayView, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    return ReplayView(console, clock=clock, line_every=5.0), out


def test_off_a_terminal_progress_is_a_plain_line_every_few_seconds_and_the_last() -> None:
    clock = FakeClock()
    view, out = _line_view(clock)
    with view:
        for done in (0, 10, 20, 30, 40):
            view(Progress(done, 100, 10.0, (100 - done) / 10.0))
            clock.now += 2.0
    lines = out.getvalue().splitlines()
    assert lines == [
        "replayed 0 of 100 log offsets (0%), 10/s, ETA 0:00:10",
        "replayed 30 of 100 log offsets (30%), 10/s, ETA 0:00:07",  # 6 s after the first
        "replayed 40 of 100 log offsets (40%), 10/s, ETA 0:00:06",  # the last, on exit
    ]
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_the_complete_line_is_printed_at_once_and_only_once() -> None:
    clock = FakeClock()
    view, out = _line_view(clock)
    with view:
        view(Progress(0, 50, None, None))
        view(Progress(50, 50, 100.0, 0.0))
    assert out.getvalue().splitlines() == [
        "replayed 0 of 50 log offsets (0%), -/s, ETA ?",
        "replayed 50 of 50 log offsets (100%), 100/s, ETA 0:00:00",
    ]


def test_on_a_terminal_progress_is_a_bar() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with ReplayView(console) as view:
        view(Progress(1_500, 6_000, 500.0, 9.0))
    text = out.getvalue()
    assert "\x1b[" in text  # drawn with control codes, redrawn in place
    assert "1,500/6,000 log offsets" in text and "500/s" in text and "ETA 0:00:09" in text


def test_formats() -> None:
    assert format_rate(None) == "-/s" and format_rate(12_345.6) == "12,346/s"
    assert format_eta(None) == "?" and format_eta(3_725.4) == "1:02:05"
    assert progress_line(Progress(0, 0, None, 0.0)).startswith("replayed 0 of 0 log offsets (100%)")


def test_plan_lines_name_every_topic_partition_and_offset() -> None:
    topics = AggregateTopics("shop", "order")
    plan = RebuildPlan(
        "g1",
        0,
        (
            TypePlan(
                topics,
                (
                    PartitionPlan(0, 3, 57, 41, Span(0, 41)),
                    PartitionPlan(1, 0, 0, None, Span(0, 0)),
                ),
            ),
        ),
    )
    assert plan_lines(plan, done=False) == [
        "shop.order: changelog shop.order.timers",
        "  shop.order.timers[0]: delete the records before offset 57 (held 3..56)",
        "  shop.order.timers[1]: delete the records before offset 0 (none held)",
        "shop.order: group g1 on shop.order.events",
        "  shop.order.events[0]: set the committed offset 41 to 0; "
        "the replay ends when the group commits offset 41 (41 to replay)",
        "  shop.order.events[1]: set the committed offset none to 0; "
        "the replay ends when the group commits offset 0 (0 to replay)",
    ]
    assert plan_lines(plan, done=True)[1].startswith(
        "  shop.order.timers[0]: deleted the records before offset 57"
    )
    assert plan.spans() == {
        ("shop.order.events", 0): Span(0, 41),
        ("shop.order.events", 1): Span(0, 0),
    }
