"""How `tickwheel jobs` reports what came of its commands (`app.cli.job_options.report`):
changes of instances (enable, disable, reschedule) by instance, runs (trigger, backfill) by
instance and request id; a refusal or a missing result after a wait ends with exit 1; a
newer writer's result code is named (the timer changes' refusals too)."""

from __future__ import annotations

import orjson
import pytest
import typer

from app.cli.job_options import report
from app.protocol.wire import CommandEnvelope, CommandResult, ResultCode
from tables import AggregateRef

REF = AggregateRef(context="ops", aggregate="schedule", id="nightly")


def _command(request_id: str, body: dict[str, object]) -> CommandEnvelope:
    return CommandEnvelope(
        request_id=request_id, type="wow.schedule.X", aggregate=REF, body=body, issued_at=1
    )


def _result(request_id: str, code: ResultCode, message: str = "") -> CommandResult:
    return CommandResult(
        request_id=request_id, code=code, aggregate=REF, message=message, decided_at=2
    )


def test_instance_changes_are_named_by_instance_and_a_refusal_fails_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = [_command("a", {"job": "nightly"}), _command("b", {})]
    results = {"a": _result("a", ResultCode.COMMITTED), "b": _result("b", ResultCode.BUSY, "m")}
    with pytest.raises(typer.Exit) as ended:
        report("enable", commands, results, 5.0, False, runs=False)
    assert ended.value.exit_code == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"enable {REF}: COMMITTED", f"enable {REF}: BUSY: m"]
    assert err == "error: enable was refused for some instances (see above)\n"


def test_runs_are_named_by_request_id_and_missing_results_fail_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = [_command("r-1", {"slot": 3, "due_at": 9}), _command("r-2", {})]
    with pytest.raises(typer.Exit) as ended:
        report(
            "backfill",
            commands,
            {"r-1": _result("r-1", ResultCode.DUPLICATE)},
            2.0,
            False,
            runs=True,
        )
    assert ended.value.exit_code == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"backfill {REF} r-1: DUPLICATE",
        f"backfill {REF} r-2: sent; no result within 2 s",
    ]
    assert err.startswith("error: no result within 2 s for 1 run(s): is a worker")


def test_a_refused_run_fails_and_an_empty_range_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    refused = {"t": _result("t", ResultCode.ERROR)}
    with pytest.raises(typer.Exit):
        report("trigger", [_command("t", {})], refused, 0.0, False, runs=True)
    assert (
        capsys.readouterr().err
        == "error: trigger was refused or failed for some runs (see above)\n"
    )
    report("backfill", [], {}, 1.0, False, runs=True)
    assert capsys.readouterr().err == "backfill: no slot in the range\n"
    report("enable", [], {}, 1.0, False, runs=False)
    assert capsys.readouterr() == ("", "")


def test_as_json_a_run_carries_its_slot_and_a_change_does_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report("backfill", [_command("r", {"slot": 3, "due_at": 9})], {}, 0.0, True, runs=True)
    report("disable", [_command("d", {})], {}, 0.0, True, runs=False)
    backfilled, disabled = (orjson.loads(line) for line in capsys.readouterr().out.splitlines())
    assert set(backfilled) == {
        "action",
        "instance",
        "request_id",
        "slot",
        "due_at",
        "code",
        "message",
    }
    assert (backfilled["slot"], backfilled["due_at"], backfilled["code"]) == (3, 9, None)
    assert set(disabled) == {"action", "instance", "request_id", "code", "message"}


def test_a_result_code_this_version_does_not_know_is_named_in_the_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A newer writer's code is read as ERROR (`CommandResult.reason` keeps it): the report
    names it, as the web edge does, in text and in JSON."""
    newer = CommandResult.model_validate(
        {**_result("a", ResultCode.ERROR, "later").model_dump(mode="json"), "code": "DEFERRED"}
    )
    for as_json in (False, True):
        with pytest.raises(typer.Exit):
            report("trigger", [_command("a", {})], {"a": newer}, 5.0, as_json, runs=True)
        out, _ = capsys.readouterr()
        assert "result code DEFERRED (unknown to this version, read as ERROR): later" in out


def test_a_timer_change_answered_with_an_unknown_code_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tickwheel timers set|cancel|...` refused: the error names a newer writer's code."""
    from app.cli.timer_changes import _answer

    newer = CommandResult.model_validate(
        {**_result("a", ResultCode.ERROR, "later").model_dump(mode="json"), "code": "DEFERRED"}
    )
    with pytest.raises(typer.Exit) as ended:
        _answer("pause", _command("a", {"key": "pay"}), newer, False)
    assert ended.value.exit_code == 1
    _, err = capsys.readouterr()
    assert "pause refused: ERROR result code DEFERRED (unknown to this version" in err
