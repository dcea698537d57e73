"""A rebuild planned and carried out (`app.ops.rebuild`) on the in-memory log, through the
`Clients` port as the CLI runs it: the plan reads the changelog's offsets, the group's
committed offsets and each log partition's replay span and changes nothing; carrying it
out empties the changelog and sets the group back to the start; a group with a member,
or a topic not there, stops it with nothing changed."""

from __future__ import annotations

import pytest

from app.errors import GroupBusy, MissingTopic
from app.kafka import TopicSpec
from app.kafka.memory import MemoryLog
from app.ops.rebuild import Span, apply_plan, plan_rebuild, rebuild
from app.protocol.topics import AggregateTopics

GROUP = "g"
TOPICS = AggregateTopics("shop", "order")
PARTITIONS = 2


async def nothing(partitions: set[tuple[str, int]]) -> None:
    return None


async def worked_log() -> MemoryLog:
    """Events a worker read to the end of each partition, its changelog rows and offsets
    committed in one transaction, and an aborted event after them (never replayed)."""
    log = MemoryLog(
        [TopicSpec(TOPICS.events, PARTITIONS), TopicSpec(TOPICS.timers_changelog, PARTITIONS)]
    )
    events = [(TOPICS.events, 0, b"o", b"e")] * 3 + [(TOPICS.events, 1, b"o", b"e")] * 2
    await log.publisher().send_many(events)
    worker = log.transactional_writer("worker")
    await worker.start()
    rows = [(TOPICS.timers_changelog, p, b"row", b"{}") for p in range(PARTITIONS)]
    await worker.commit(rows, {(TOPICS.events, 0): 3, (TOPICS.events, 1): 2}, GROUP)
    await worker.send([(TOPICS.events, 0, b"o", b"aborted")])
    await worker.abort()
    return log


def state(log: MemoryLog) -> tuple[object, ...]:
    return tuple(
        (
            log.offsets(TOPICS.timers_changelog, p),
            log.committed(GROUP, TOPICS.events, p),
        )
        for p in range(PARTITIONS)
    )


async def test_the_plan_reads_and_changes_nothing_and_the_rebuild_does_what_it_says() -> None:
    log = await worked_log()
    before = state(log)
    plan = await plan_rebuild(log, GROUP, [TOPICS])
    assert state(log) == before
    assert plan.members == 0
    [typed] = plan.types
    got = [(p.changelog_start, p.changelog_end, p.committed, p.replay) for p in typed.partitions]
    # Each changelog partition: its row and the commit marker; the replay ends past the
    # last committed event (not past the abort marker or the aborted event).
    assert got == [(0, 2, 3, Span(0, 3)), (0, 2, 2, Span(0, 2))]

    await apply_plan(log, plan)
    for p in range(PARTITIONS):
        assert log.offsets(TOPICS.timers_changelog, p) == (2, 2)
        assert log.records(TOPICS.timers_changelog, p) == []
        assert log.committed(GROUP, TOPICS.events, p) == 0


async def test_a_group_with_a_member_is_not_rebuilt() -> None:
    log = await worked_log()
    member = log.group_member(GROUP, [TOPICS.events], on_assigned=nothing, on_revoked=nothing)
    await member.start()
    try:
        before = state(log)
        plan = await plan_rebuild(log, GROUP, [TOPICS])
        assert plan.members == 1
        with pytest.raises(GroupBusy, match="has 1 running worker"):
            await apply_plan(log, plan)
        assert state(log) == before
    finally:
        await member.stop()
    # Gone since: a plan made while it ran still says it was there, and is refused.
    with pytest.raises(GroupBusy):
        await apply_plan(log, plan)
    await rebuild(log, GROUP, [TOPICS])
    assert log.committed(GROUP, TOPICS.events, 0) == 0


async def test_missing_topics_are_named_and_none_is_created() -> None:
    log = MemoryLog([TopicSpec(TOPICS.events, PARTITIONS)])
    with pytest.raises(MissingTopic, match=TOPICS.timers_changelog) as raised:
        await plan_rebuild(log, GROUP, [TOPICS])
    assert f"topic {TOPICS.events} does not exist" not in str(raised.value)
    assert log.topic_names() == {TOPICS.events}


async def test_a_count_not_recorded_after_the_reset_says_to_run_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partition count is written last, after the changelogs were emptied: a write that
    fails there (no Write ACL on the nodes topic, the broker gone) says what was done and
    that the same rebuild, run again, records it (it empties nothing more)."""
    from app.errors import KafkaUnavailable
    from app.ops import rebuild as rebuild_module
    from app.protocol.topics import ContextTopics

    log = await worked_log()
    log.create_topic(ContextTopics(TOPICS.context).nodes)

    async def refused(*args: object, **kwargs: object) -> None:
        raise KafkaUnavailable("TopicAuthorizationFailedError")

    monkeypatch.setattr(rebuild_module, "write_counts", refused)
    plan = await plan_rebuild(log, GROUP, [TOPICS])
    with pytest.raises(KafkaUnavailable) as refusal:
        await apply_plan(log, plan)
    said = str(refusal.value)
    assert "changelogs were emptied and the log offsets reset" in said
    assert "run the same rebuild again" in said and "TopicAuthorizationFailedError" in said
    assert log.records(TOPICS.timers_changelog, 0) == []


async def test_a_group_with_no_offset_on_a_log_whose_changelog_holds_rows_is_refused() -> None:
    """Not the group whose workers built the table (their shell's TICKWHEEL_GROUP_ID
    missing, a typo): emptied, the changelog would be replayed by no one."""
    from app.errors import ConfigError

    log = await worked_log()
    before = state(log)
    plan = await plan_rebuild(log, "other", [TOPICS])
    with pytest.raises(ConfigError, match=f"'other' has no committed offset on {TOPICS.events}"):
        await apply_plan(log, plan)
    assert state(log) == before
    await apply_plan(log, plan, new_group=True)  # said on purpose: a group never run there
    assert log.committed("other", TOPICS.events, 0) == 0


async def test_a_group_with_no_offset_on_a_log_whose_changelog_holds_nothing_is_rebuilt() -> None:
    """Nothing to lose (workers that never kept a timer): as after topics were given more
    partitions, the rebuild records the new count."""
    log = MemoryLog(
        [TopicSpec(TOPICS.events, PARTITIONS), TopicSpec(TOPICS.timers_changelog, PARTITIONS)]
    )
    await rebuild(log, GROUP, [TOPICS])
    assert log.committed(GROUP, TOPICS.events, 0) == 0
