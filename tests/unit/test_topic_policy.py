"""A compacted topic found already there is kept as the node makes it, `cleanup.policy`
compact alone: with `delete` in it, a table's rows go after `retention.ms` and every
restore after that loses them, quietly. The node refuses to start on it instead; one that
may not read topic configs is only warned about. An aggregate's log found dropping records
(a retention, compaction) is warned about, never refused: it is its team's."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import ClusterAuthorizationFailedError

from app.errors import KafkaUnavailable
from app.kafka.topic_policy import check_compacted, log_warning, policy_refusal

KEPT = {"retention.ms": "-1", "retention.bytes": "-1"}
DEFAULT = {"retention.ms": "604800000", "retention.bytes": "-1"}


@pytest.mark.parametrize(
    "configs",
    [
        {"cleanup.policy": "compact", **DEFAULT},
        {"cleanup.policy": " compact ", **DEFAULT},
        {"cleanup.policy": "compact,delete", **KEPT},  # as the node makes its tables
        {
            "cleanup.policy": "compact,delete",
            "retention.ms": "9223372036854775807",
            "retention.bytes": "-1",
        },
    ],
)
def test_compacted_tables_that_delete_nothing_are_kept(configs: dict[str, str]) -> None:
    assert policy_refusal("ctx.a.timers", configs) is None


@pytest.mark.parametrize(
    "configs",
    [
        {"cleanup.policy": "delete", **KEPT},
        {"cleanup.policy": "compact,delete", **DEFAULT},
        {"cleanup.policy": "delete,compact", "retention.ms": "-1", "retention.bytes": "1000"},
        {"cleanup.policy": "", **KEPT},
    ],
)
def test_a_table_that_deletes_rows_is_refused_saying_how_to_set_it(
    configs: dict[str, str],
) -> None:
    why = policy_refusal("ctx.a.timers", configs)
    assert why is not None and "ctx.a.timers" in why
    assert "cleanup.policy=[compact,delete],retention.ms=-1,retention.bytes=-1" in why


class _Answer:
    def __init__(self, resources: list[tuple[Any, ...]]) -> None:
        self.resources = resources


class _Admin:
    """Answers DescribeConfigs with each topic's `cleanup.policy` and the broker's default
    retentions (or raises `error`)."""

    def __init__(self, policies: dict[str, str], error: Exception | None = None) -> None:
        self.policies, self.error = policies, error
        self.asked: list[str] = []

    async def describe_configs(self, resources: list[Any]) -> list[_Answer]:
        if self.error is not None:
            raise self.error
        self.asked += [r.name for r in resources]
        return [
            _Answer(
                [
                    (
                        0,
                        None,
                        2,
                        r.name,
                        [("cleanup.policy", self.policies[r.name]), *DEFAULT.items()],
                    )
                ]
            )
            for r in resources
        ]


async def test_the_first_topic_that_deletes_stops_the_start() -> None:
    admin = _Admin({"ctx.a.timers": "compact", "ctx.b.timers": "delete"})
    with pytest.raises(
        KafkaUnavailable,
        match=r"ctx\.b\.timers has cleanup\.policy=delete, retention\.ms=604800000",
    ):
        await check_compacted(admin, ["ctx.a.timers", "ctx.b.timers"])
    assert admin.asked == ["ctx.a.timers", "ctx.b.timers"]


async def test_compacted_topics_pass_and_none_asks_nothing() -> None:
    admin = _Admin({"ctx.a.timers": "compact"})
    await check_compacted(admin, ["ctx.a.timers"])
    await check_compacted(admin, [])
    assert admin.asked == ["ctx.a.timers"]


async def test_configs_it_may_not_read_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    admin = _Admin({}, error=ClusterAuthorizationFailedError())
    await check_compacted(admin, ["ctx.a.timers"])
    assert "cannot read the cleanup.policy of ctx.a.timers" in caplog.text


@pytest.mark.parametrize(
    ("configs", "warned"),
    [
        ({"cleanup.policy": "delete", **KEPT}, False),  # as the node makes a log
        ({"cleanup.policy": "delete", **DEFAULT}, True),  # the broker's default
        ({"cleanup.policy": "compact", **KEPT}, True),
        ({"cleanup.policy": "compact,delete", **KEPT}, True),
        ({"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "1000"}, True),
    ],
)
def test_a_log_that_drops_records_is_warned_about(configs: dict[str, str], warned: bool) -> None:
    warning = log_warning("ctx.a.events", configs)
    assert (warning is not None) is warned
    if warning is not None:
        assert "ctx.a.events" in warning and "retention.ms=-1,retention.bytes=-1" in warning


async def test_logs_are_read_with_the_tables_and_warned_about_not_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = _Admin({"ctx.a.timers": "compact", "ctx.a.events": "delete"})
    await check_compacted(admin, ["ctx.a.timers"], ["ctx.a.events"])
    assert admin.asked == ["ctx.a.timers", "ctx.a.events"]
    assert "the log ctx.a.events has cleanup.policy=delete, retention.ms=604800000" in caplog.text
    caplog.clear()
    await check_compacted(_Admin({"ctx.a.events": "compact"}), [], ["ctx.a.events"])
    assert "the log ctx.a.events has cleanup.policy=compact" in caplog.text
