"""A job declared wrong is refused where it is declared, naming the job and what is wrong.

A rule that was no rule object (a dict read from config, a cron string, None) or a handler
that could not be called was taken: each Enable of the job then answered ERROR
(`AttributeError: 'dict' object has no attribute 'model_dump'`), and each tick of an
instance enabled by the release before failed, was retried and parked. Two jobs of one
name in a context were refused only when a worker started."""

from __future__ import annotations

from typing import Any

import pytest

from app.jobs import Job, JobRun, JobScope
from app.service import Service
from tables import CronRule, IntervalRule, OnceRule

EVERY_MINUTE = IntervalRule(start=0, every=60_000)


def handler(run: JobRun) -> None:
    del run


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        ({"kind": "interval", "start": 0, "every": 60_000}, "dict"),
        ("0 * * * *", "str"),
        (None, "NoneType"),
        (60_000, "int"),
    ],
)
def test_a_job_whose_rule_is_no_rule_object_is_refused_at_declaration(
    rule: Any, named: str
) -> None:
    with pytest.raises(
        TypeError, match=f"^job 'sweep': its rule must be a OnceRule, .* not {named}"
    ):
        Job("sweep", JobScope.SYSTEM, rule, handler)


@pytest.mark.parametrize("not_callable", ["handler", None, 3])
def test_a_job_whose_handler_cannot_be_called_is_refused_at_declaration(
    not_callable: Any,
) -> None:
    with pytest.raises(TypeError, match=r"^job 'sweep': its handler must be callable"):
        Job("sweep", JobScope.SYSTEM, EVERY_MINUTE, not_callable)


@pytest.mark.parametrize(
    "rule", [EVERY_MINUTE, CronRule(expr="0 3 * * *"), OnceRule(at=1_800_000_000_000)]
)
def test_each_kind_of_rule_and_a_callable_object_are_taken(rule: Any) -> None:
    class Handler:
        def __call__(self, run: JobRun) -> None:
            del run

    assert Job("sweep", JobScope.SYSTEM, rule, Handler()).rule is rule


def test_a_service_declaring_two_jobs_of_one_name_in_a_context_is_refused() -> None:
    """Taken, the service imported fine and every worker failed to start ("unexpected
    ValueError: job 'sweep' declared twice")."""
    a = Job("sweep", JobScope.SYSTEM, EVERY_MINUTE, handler)
    b = Job("sweep", JobScope.TENANT, IntervalRule(start=0, every=5_000), handler)
    with pytest.raises(ValueError, match=r"^jobs declared twice in ops: \['sweep'\]$"):
        Service(aggregates=(), jobs={"ops": [a, b]})
    # One name in two contexts is two jobs: each context has its own schedule.
    service = Service(aggregates=(), jobs={"ops": [a], "shop": [b]})
    assert [agg.type_name for agg in service.all_aggregates(4)] == [
        "ops.schedule",
        "shop.schedule",
    ]
