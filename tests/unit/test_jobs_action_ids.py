"""A request id reused for another job action is not that action's DUPLICATE.

`--request-id` and `Idempotency-Key` were each command's request id as given: an operator
who named a change once (`CHG-1234`) and disabled, then enabled, the job under it was
answered DUPLICATE for the enable (read as done), and the job stayed disabled; a trigger
under it ran nothing. Each action's id is now its own, `<action>:<request id>`, made the
same way by the CLI, the HTTP routes and the operator page (`action_request_id`): the same
action sent again under the same id is still a DUPLICATE."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import T0, FakeClock, WebNode, web_node
from test_job_routes import CONTEXT, MINUTELY, SERVICE, P
from test_jobs import CONTEXT as OPS
from test_jobs import Instance, Recorder, make_jobs

from app.jobs import DISABLED, ENABLED, TRIGGERED, action_request_id, schedule_aggregate
from app.ops.job_api import JobInputError, instance_commands
from app.ops.job_models import JobBody
from app.protocol.wire import ResultCode


def test_one_request_id_for_a_disable_an_enable_and_a_trigger_does_each() -> None:
    recorder = Recorder()
    nightly, _, _ = make_jobs(recorder)
    instance = Instance(schedule_aggregate(OPS, make_jobs(recorder), 8))

    def sent(action: str, request_id: str = "CHG-1234") -> ResultCode:
        (command,) = instance_commands(action, OPS, nightly, partitions=8, request_id=request_id)
        return instance.run(command).code

    assert sent("enable", "first") is ResultCode.COMMITTED
    assert sent("disable") is ResultCode.COMMITTED
    assert instance.state.enabled is False
    # The same change id for the enable: it was the disable's DUPLICATE, nothing enabled.
    assert sent("enable") is ResultCode.COMMITTED
    assert instance.state.enabled is True
    assert sent("trigger") is ResultCode.COMMITTED
    assert len(recorder.runs) == 1
    assert [e.type for e in instance.log if e.type in (DISABLED, ENABLED, TRIGGERED)] == [
        ENABLED,
        DISABLED,
        ENABLED,
        TRIGGERED,
    ]
    # Each action sent again under its id is written once.
    for action in ("disable", "enable", "trigger"):
        assert sent(action) is ResultCode.DUPLICATE, action
    assert len(recorder.runs) == 1


def test_an_actions_id_is_the_same_sent_again_as_it_was_answered() -> None:
    """The id an answer names (`<action>:<request id>`, or a fresh `<action>:…` one), given
    again as the request id, is that action's id: the retry it names is a DUPLICATE."""
    _, _, report = make_jobs(Recorder())
    for action in ("enable", "disable", "reschedule", "trigger"):
        given = action_request_id(action, "CHG-1")
        assert given == f"{action}:CHG-1"
        assert action_request_id(action, given) == given
        (fresh,) = instance_commands(action, OPS, report, partitions=8, tenants=["acme"])
        assert action_request_id(action, fresh.request_id) == fresh.request_id
    # Several instances: `<action>:<request id>@<tenant>/<instance>`, one instance's id
    # given again for that instance alone is the same (the CLI's advice for a trigger).
    made = instance_commands(
        "trigger", OPS, report, partitions=8, tenants=["a", "b"], request_id="CHG-1"
    )
    assert [c.request_id for c in made] == ["trigger:CHG-1@a/report", "trigger:CHG-1@b/report"]
    (again,) = instance_commands(
        "trigger", OPS, report, partitions=8, tenants=["b"], request_id=made[1].request_id
    )
    assert again.request_id == made[1].request_id
    disabled = instance_commands(
        "disable", OPS, report, partitions=8, tenants=["a", "b"], request_id="CHG-1"
    )
    assert not {c.request_id for c in made} & {c.request_id for c in disabled}


async def test_one_idempotency_key_for_a_disable_then_an_enable_over_http(tmp_path: Path) -> None:
    async with web_node(SERVICE, tmp_path, FakeClock(T0 - 30_000), WebNode, partitions=P) as edge:
        path = f"/jobs/{CONTEXT}/{MINUTELY.name}"

        async def act(action: str, key: str) -> list[str]:
            headers = {"Idempotency-Key": key}
            status, answer = await edge.call("POST", f"{path}/{action}", None, headers=headers)
            assert status == 200, answer
            return [o["code"] for o in answer["outcomes"]]

        assert await act("enable", "first") == ["COMMITTED"]
        assert await act("disable", "CHG-1234") == ["COMMITTED"]
        # The same change's key for the enable: it was the disable's DUPLICATE.
        assert await act("enable", "CHG-1234") == ["COMMITTED"]
        assert await act("enable", "CHG-1234") == ["DUPLICATE"]
        assert await act("disable", "CHG-1234") == ["DUPLICATE"]
        status, listed = await edge.call("GET", "/jobs?job=minutely&state=true", token=None)
        assert status == 200, listed
        assert listed["jobs"][0]["state"][0]["enabled"] is True


def test_a_long_id_an_answer_named_is_taken_back() -> None:
    """The caller's part is what is held to 200 characters: the id an answer names for a
    caller's 200 (`trigger:` and them, which the CLI's advice prints) is taken back, over
    HTTP too (`JobBody`); a caller's 201 is refused. One begun with the action's prefix is
    an instance's whole id (`@<tenant>/<instance>` too when several shared it): held to
    what a request id may be (a trigger's: room kept for its run's sends)."""
    nightly, _, _ = make_jobs(Recorder())
    (cmd,) = instance_commands("trigger", OPS, nightly, partitions=8, request_id="x" * 200)
    assert cmd.request_id == "trigger:" + "x" * 200
    (again,) = instance_commands("trigger", OPS, nightly, partitions=8, request_id=cmd.request_id)
    assert again.request_id == cmd.request_id
    assert JobBody(request_id="reschedule:" + "x" * 200).request_id is not None
    for too_long in ("x" * 201, "trigger:" + "x" * 289):
        with pytest.raises(JobInputError, match="1-200 characters"):
            instance_commands("trigger", OPS, nightly, partitions=8, request_id=too_long)
    (shared,) = instance_commands(
        "trigger", OPS, nightly, partitions=8, request_id="trigger:" + "x" * 288
    )
    assert shared.request_id == "trigger:" + "x" * 288
    # Another action's prefix is the caller's own text: counted.
    with pytest.raises(JobInputError, match="1-200 characters"):
        instance_commands("trigger", OPS, nightly, partitions=8, request_id="enable:" + "x" * 195)
