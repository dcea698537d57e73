"""A trigger of several instances under a long request id (`tickwheel jobs trigger
--request-id`, 1-200 characters): when its send fails, the CLI says per instance the
options to send it again under its request id (`app.cli.job_actions._resend`). Each is
taken and makes the same request id (a DUPLICATE, never a second run): an instance's id
an answer named was held to 200 characters whole, its `@<tenant>/<instance>` included, and
refused."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from app.cli.job_actions import _resend
from app.jobs import Job, JobRun, JobScope
from app.ops.job_api import JobInputError, instance_commands
from tables import IntervalRule

P = 8


def _nothing(run: JobRun) -> None:
    pass


SWEEP = Job("sweep", JobScope.SHARDED, IntervalRule(start=0, every=1_000), _nothing)
REPORT = Job("report", JobScope.TENANT, IntervalRule(start=0, every=60_000), _nothing)


@pytest.mark.parametrize(("job", "where"), [(SWEEP, {}), (REPORT, {"tenants": ["t1", "t2"]})])
def test_the_advice_to_send_each_trigger_again_is_taken(job: Job, where: dict[str, Any]) -> None:
    commands = instance_commands("trigger", "ops", job, partitions=P, request_id="r" * 190, **where)
    advice = _resend(commands, P)
    parts = advice.split(": ", 1)[1].split("; ")
    assert len(parts) == len(commands)
    for part, original in zip(parts, commands, strict=True):
        args = shlex.split(part.split(" to learn")[0])
        opts = dict(zip(args[::2], args[1::2], strict=True))
        again = instance_commands(
            "trigger",
            "ops",
            job,
            partitions=P,
            request_id=opts["--request-id"],
            partition=int(opts["--partition"]) if "--partition" in opts else None,
            tenants=[opts["--tenant"]] if "--tenant" in opts else (),
        )
        assert [c.request_id for c in again] == [original.request_id]


def test_a_callers_id_is_held_to_200_and_an_answers_to_what_an_id_may_be() -> None:
    with pytest.raises(JobInputError, match="give 1-200 characters"):
        instance_commands("trigger", "ops", SWEEP, partitions=P, request_id="r" * 201)
    named = "trigger:" + "r" * 289
    with pytest.raises(JobInputError, match="one an answer named, 288 after 'trigger:'"):
        instance_commands("trigger", "ops", SWEEP, partitions=P, partition=0, request_id=named)
    (one,) = instance_commands(
        "disable", "ops", SWEEP, partitions=P, partition=0, request_id="disable:" + "r" * 280
    )
    assert one.request_id == "disable:" + "r" * 280
