"""`python -m bench.compare`: its summaries of both harnesses' JSON, and a peer that cannot
run (no benchmark is run here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import compare

PEER = {
    "peer": "db-scheduler",
    "versions": {"db_scheduler": "16.7.1"},
    "machine": {"loadavg_at_jvm_start": "0.62 0.52 0.31", "loadavg_at_jvm_end": "1.30 0.68"},
    "burst": {
        "tasks": 2000,
        "insert_rate_per_s": 3285.8,
        "executions_per_s": 2000.0,
        "first_exec_lateness_s": 0.025,
        "last_exec_after_due_s": 0.895,
        "missing": 0,
        "duplicates": 0,
        "cpu_ms_per_task": {"execute_jvm": 0.36, "execute_postgres": 0.075},
    },
    "steady": {
        "scheduled": 1500,
        "lateness_s": {"p50": 0.049, "p99": 0.1, "max": 0.109},
        "executed_by_end_of_drain": 1500,
        "missing": 0,
        "duplicates": 0,
        "inserted_after_due": 0,
        "keeps_up": True,
        "cpu_ms_per_task_insert_and_execute": {"jvm": 0.887, "postgres": 0.46},
    },
}

TICKWHEEL = {
    "machine": {"code": "abc1234"},
    "a_burst": {
        "timers": 2000,
        "ingest_per_s": 1807,
        "timers_per_s": 1000.0,
        "first_fired_after_t0_ms": 775,
        "all_settled_after_t0_s": 1.52,
        "applied": 2000,
        "duplicates": 0,
        "cpu": {"wall_s": 2.0, "cores_used": {"worker1": 0.5, "worker2": 0.5, "broker": 0.8}},
    },
    "b_lateness": {
        "timers": 1500,
        "lateness": {"count": 1500, "p50_ms": 217.0, "p99_ms": 867, "max_ms": 1000},
        "applied": 1500,
        "unfired_at_end": 0,
        "duplicates": 0,
        "put_after_due": 0,
        "cpu": {"wall_s": 15.0, "cores_used": {"worker1": 0.2, "worker2": 0.2, "bench": 0.3}},
    },
}


def test_peer_figures_are_in_ms_and_cpu_adds_jvm_and_postgres() -> None:
    p = compare.peer_summary(PEER)
    assert p["name"] == "db-scheduler"
    assert p["burst"]["executions_per_s"] == 2000.0
    assert p["burst"]["first_exec_lateness_ms"] == 25.0
    assert p["burst"]["cpu_ms_per_task"]["total"] == 0.435
    assert (p["steady"]["lateness_p50_ms"], p["steady"]["lateness_p99_ms"]) == (49.0, 100.0)
    assert p["steady"]["keeps_up"] is True
    assert p["steady"]["cpu_ms_per_task"]["total"] == 1.347


def test_tickwheel_cpu_per_timer_is_workers_and_broker_not_the_bench() -> None:
    t = compare.tickwheel_summary(TICKWHEEL)
    assert t["code"] == "abc1234"
    assert t["burst"]["timers_per_s"] == 1000.0
    assert t["burst"]["all_settled_after_t0_ms"] == 1520.0
    # 1.0 worker cores and 0.8 broker cores for 2 s over 2,000 timers
    assert t["burst"]["cpu_ms_per_timer"] == {"workers": 1.0, "broker": 0.8, "total": 1.8}
    # no broker figure (not found on this machine): no total
    assert t["steady"]["cpu_ms_per_timer"] == {"workers": 4.0, "broker": None, "total": None}
    assert (t["steady"]["lateness_p99_ms"], t["steady"]["unfired_at_end"]) == (867, 0)


def test_ratios_are_tickwheel_over_peer_and_none_without_a_side() -> None:
    t, p = compare.tickwheel_summary(TICKWHEEL), compare.peer_summary(PEER)
    r = compare.ratios(t, p)
    assert r["burst"] == 0.5
    assert r["steady_p99"] == 8.67
    assert compare.ratios(t, {"error": "cannot run"}) == dict.fromkeys(r)
    assert compare.tickwheel_summary({})["steady"]["lateness_p99_ms"] is None


def test_peer_missing_names_what_is_missing(tmp_path: Path) -> None:
    assert "the peer harness" in compare.peer_missing(tmp_path / "run.sh")[0]
    run_sh = tmp_path / "run.sh"
    run_sh.write_text("#!/bin/sh\n")
    env = {"PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)}
    missing = " ".join(compare.peer_missing(run_sh, env))
    assert "java" in missing and "mvn" in missing


def test_a_peer_that_cannot_run_is_an_error_in_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = compare.main(["--only", "peer", "--peer", str(tmp_path / "nowhere.sh")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["peer"]["error"].startswith("cannot run, missing: the peer harness")
    assert out["tickwheel"] is None
    assert out["ratio"]["burst"] is None
    assert out["machine"]["nproc"] and len(out["machine"]["loadavg_after"]) == 3
