"""Tickwheel's timers next to a peer (db-scheduler on PostgreSQL), the same work, one JSON.

    python -m bench.compare                             # N 10,000; 1,000/s for 20 s; lead 2 s
    python -m bench.compare --n 2000 --rate 300 --seconds 5
    python -m bench.compare --only tickwheel --tickwheel-arg=--timer-options='{"batch_limit": 500}'
    python -m bench.compare --peer /elsewhere/run.sh --peer-arg=--polling-ms=50

Runs, one after the other and each as a subprocess, the peer harness
(`../shared/peers/dbscheduler/run.sh` beside the repo, see its README.md) and
`bench.timers_bench --phases ab --workers 2` with the same work: a burst of `--n` one-off
timers due at once, then `--rate` timers due per second for `--seconds`, each set
`--lead-ms` before it is due, at most `--drain-s` of waiting after the last due time, on two
instances (2 db-scheduler instances; 2 Tickwheel workers). Prints one JSON object: the
machine (load average before and after), the work, a summary of each side (all durations in
ms, the peer's seconds converted) with its full output under `raw`, and the ratios
Tickwheel / peer. A side that cannot run is `{"error": ...}` and the other is still measured.

CPU per timer is that of the system under test: db-scheduler's JVM (which also holds the
scheduling client) + PostgreSQL; Tickwheel's workers + the broker (the bench process is left
out). The peer's burst CPU is the execution only, as is Tickwheel's (from T0 on).

Exit status 1 when Tickwheel's bench (or, with `--only peer`, the peer) gave no figures.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import ROOT, machine

PEER = ROOT.parent / "shared" / "peers" / "dbscheduler" / "run.sh"
INSTANCES = 2
NOTABLE = re.compile(r"error|exception|missing|not found|exited|cannot|refused", re.IGNORECASE)


def dig(d: Any, *keys: str) -> Any:
    """d[k1][k2]…, or None where something is missing."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def ms(seconds: Any) -> float | None:
    return None if seconds is None else round(float(seconds) * 1000, 1)


def add(*values: Any) -> float | None:
    return None if any(v is None for v in values) else round(sum(values), 3)


def ratio(a: Any, b: Any) -> float | None:
    return None if a is None or not b else round(a / b, 3)


# --------------------------------------------------------------------------- summaries


def peer_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """The figures of db-scheduler's harness output to read next to Tickwheel's."""
    burst, steady = raw.get("burst") or {}, raw.get("steady") or {}
    cpu_b = burst.get("cpu_ms_per_task") or {}
    cpu_s = steady.get("cpu_ms_per_task_insert_and_execute") or {}
    lateness = steady.get("lateness_s") or {}
    return {
        "name": raw.get("peer"),
        "versions": raw.get("versions"),
        "burst": {
            "tasks": burst.get("tasks"),
            "insert_per_s": burst.get("insert_rate_per_s"),
            "executions_per_s": burst.get("executions_per_s"),
            "first_exec_lateness_ms": ms(burst.get("first_exec_lateness_s")),
            "last_exec_after_due_ms": ms(burst.get("last_exec_after_due_s")),
            "missing": burst.get("missing"),
            "duplicates": burst.get("duplicates"),
            "cpu_ms_per_task": {
                "jvm": cpu_b.get("execute_jvm"),
                "postgres": cpu_b.get("execute_postgres"),
                "total": add(cpu_b.get("execute_jvm"), cpu_b.get("execute_postgres")),
            },
        },
        "steady": {
            "tasks": steady.get("scheduled"),
            "lateness_p50_ms": ms(lateness.get("p50")),
            "lateness_p99_ms": ms(lateness.get("p99")),
            "lateness_max_ms": ms(lateness.get("max")),
            "executed": steady.get("executed_by_end_of_drain"),
            "missing": steady.get("missing"),
            "duplicates": steady.get("duplicates"),
            "inserted_after_due": steady.get("inserted_after_due"),
            "keeps_up": steady.get("keeps_up"),
            "cpu_ms_per_task": {
                "jvm": cpu_s.get("jvm"),
                "postgres": cpu_s.get("postgres"),
                "total": add(cpu_s.get("jvm"), cpu_s.get("postgres")),
            },
        },
        "load_1m": {
            "at_jvm_start": dig(raw, "machine", "loadavg_at_jvm_start"),
            "at_jvm_end": dig(raw, "machine", "loadavg_at_jvm_end"),
        },
    }


def cpu_ms_per_timer(phase: dict[str, Any], timers: Any) -> dict[str, float | None]:
    """Workers' and broker's CPU over a timers_bench phase (`cpu`), per timer."""
    cpu = phase.get("cpu") or {}
    cores, wall = cpu.get("cores_used") or {}, cpu.get("wall_s")
    if not wall or not timers:
        return {"workers": None, "broker": None, "total": None}
    workers = sum(v for k, v in cores.items() if k.startswith("worker"))
    per = {"workers": workers * wall / timers * 1000, "broker": None}
    if "broker" in cores:
        per["broker"] = cores["broker"] * wall / timers * 1000
    out = {k: None if v is None else round(v, 3) for k, v in per.items()}
    return {**out, "total": add(out["workers"], out["broker"])}


def tickwheel_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """The figures of `bench.timers_bench` (phases a and b) to read next to the peer's."""
    a, b = raw.get("a_burst") or {}, raw.get("b_lateness") or {}
    lateness = b.get("lateness") or {}
    return {
        "code": dig(raw, "machine", "code"),
        "timer_options": raw.get("timer_options_effective"),
        "burst": {
            "timers": a.get("timers"),
            "ingest_per_s": a.get("ingest_per_s"),
            "timers_per_s": a.get("timers_per_s"),
            "first_fired_after_t0_ms": a.get("first_fired_after_t0_ms"),
            "all_settled_after_t0_ms": ms(a.get("all_settled_after_t0_s")),
            "applied": a.get("applied"),
            "duplicates": a.get("duplicates"),
            "cpu_ms_per_timer": cpu_ms_per_timer(a, a.get("applied")),
            "cpu": a.get("cpu"),
        },
        "steady": {
            "timers": b.get("timers"),
            "lateness_p50_ms": lateness.get("p50_ms"),
            "lateness_p99_ms": lateness.get("p99_ms"),
            "lateness_max_ms": lateness.get("max_ms"),
            "applied": b.get("applied"),
            "unfired_at_end": b.get("unfired_at_end"),
            "duplicates": b.get("duplicates"),
            "put_after_due": b.get("put_after_due"),
            "cpu_ms_per_timer": cpu_ms_per_timer(b, b.get("timers")),
            "cpu": b.get("cpu"),
        },
    }


def ratios(tickwheel: dict[str, Any] | None, peer: dict[str, Any] | None) -> dict[str, Any]:
    """Tickwheel / peer: > 1 is Tickwheel faster for `burst`, later or costlier otherwise."""
    t, p = tickwheel or {}, peer or {}
    return {
        "burst": ratio(dig(t, "burst", "timers_per_s"), dig(p, "burst", "executions_per_s")),
        "steady_p50": ratio(
            dig(t, "steady", "lateness_p50_ms"), dig(p, "steady", "lateness_p50_ms")
        ),
        "steady_p99": ratio(
            dig(t, "steady", "lateness_p99_ms"), dig(p, "steady", "lateness_p99_ms")
        ),
        "burst_cpu_per_timer": ratio(
            dig(t, "burst", "cpu_ms_per_timer", "total"),
            dig(p, "burst", "cpu_ms_per_task", "total"),
        ),
        "steady_cpu_per_timer": ratio(
            dig(t, "steady", "cpu_ms_per_timer", "total"),
            dig(p, "steady", "cpu_ms_per_task", "total"),
        ),
    }


# --------------------------------------------------------------------------- running


def peer_missing(peer: Path, env: dict[str, str] | None = None) -> list[str]:
    """What the peer harness needs and this machine lacks (empty: it can be tried)."""
    env = dict(os.environ if env is None else env)
    path = env.get("PATH")
    if not peer.is_file():
        return [f"the peer harness {peer} (clone shared/ beside the repo or give --peer)"]
    missing = []
    if not shutil.which(env.get("JAVA", "java"), path=path):
        missing.append("java (Java 17+; apt-get install -y openjdk-17-jre-headless)")
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    if not (cache / "peer-dbscheduler/target/dbscheduler-bench.jar").is_file() and not (
        shutil.which("mvn", path=path)
    ):
        missing.append("mvn, to build the harness (apt-get install -y maven)")
    bindirs = [env["PG_BINDIR"]] if env.get("PG_BINDIR") else []
    if pg_ctl := shutil.which("pg_ctl", path=path):
        bindirs.append(str(Path(pg_ctl).resolve().parent))
    bindirs += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    if not any(os.access(Path(d) / b, os.X_OK) for d in bindirs for b in ("initdb", "pg_ctl")):
        missing.append("PostgreSQL server binaries initdb, pg_ctl (apt-get install -y postgresql)")
    if not shutil.which("psql", path=path) and not any(Path(d, "psql").exists() for d in bindirs):
        missing.append("psql (apt-get install -y postgresql-client)")
    return missing


def run_json(name: str, cmd: list[str]) -> dict[str, Any]:
    """Runs `cmd` (its stderr passed on, prefixed), parses the JSON object on its stdout:
    `{"raw": ..., "wall_s", "load_1m"}` or `{"error": ...}` with the stderr lines that say
    why (errors, exceptions, what is missing) and its last ones."""
    print(f"[compare] {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    load, began = os.getloadavg()[0], time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=5)
    notable: collections.deque[str] = collections.deque(maxlen=10)
    try:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError as e:
        return {"error": f"could not start {cmd[0]}: {e}"}

    def relay() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.append(line.rstrip())
            if NOTABLE.search(line) and " LOG: " not in line:  # not PostgreSQL's log
                notable.append(line.rstrip())
            sys.stderr.write(f"[{name}] {line}")

    relaying = threading.Thread(target=relay, daemon=True)
    relaying.start()
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait()
    relaying.join(5)
    figures = {
        "wall_s": round(time.monotonic() - began, 1),
        "load_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }
    try:
        raw = json.loads(out)
    except ValueError:
        raw = None
    if proc.returncode != 0 or not isinstance(raw, dict):
        why = f"exited {proc.returncode}" if proc.returncode else "printed no JSON object"
        return {
            "error": f"{name} {why}",
            "stderr_notable": list(notable),
            "stderr_tail": list(tail),
            **figures,
        }
    return {"raw": raw, **figures}


def measure(
    name: str, cmd: list[str], summary: Any, missing: list[str] | None = None
) -> dict[str, Any]:
    if missing:
        return {"error": "cannot run, missing: " + "; ".join(missing), "command": shlex.join(cmd)}
    got = run_json(name, cmd)
    if "error" in got:
        return {**got, "command": shlex.join(cmd)}
    raw = got.pop("raw")
    return {**summary(raw), "run": {**got, "command": shlex.join(cmd)}, "raw": raw}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="burst: timers due at once")
    parser.add_argument("--rate", type=float, default=1_000, help="steady: timers due per s")
    parser.add_argument("--seconds", type=float, default=20, help="steady: how long")
    parser.add_argument("--lead-ms", type=int, default=2_000,
                        help="steady: a timer is set this long before it is due")  # fmt: skip
    parser.add_argument("--drain-s", type=float, default=10,
                        help="steady: longest wait after the last due time")  # fmt: skip
    parser.add_argument("--only", choices=["tickwheel", "peer"])
    parser.add_argument("--peer", type=Path, default=PEER, help=f"default {PEER}")
    parser.add_argument("--peer-arg", action="append", default=[], metavar="ARG",
                        help="more for run.sh, e.g. --peer-arg=--polling-ms=50")  # fmt: skip
    parser.add_argument("--tickwheel-arg", action="append", default=[], metavar="ARG",
                        help="more for bench.timers_bench, e.g. "
                        "--tickwheel-arg=--timer-options={...}")  # fmt: skip
    args = parser.parse_args(argv)

    lead_s = args.lead_ms / 1000
    peer_cmd = [str(args.peer), "--n", str(args.n), "--rate", f"{args.rate:g}",
                "--seconds", f"{args.seconds:g}", "--lead", f"{lead_s:g}",
                "--drain", f"{args.drain_s:g}", "--nodes", str(INSTANCES),
                *args.peer_arg]  # fmt: skip
    tickwheel_cmd = [sys.executable, "-m", "bench.timers_bench", "--phases", "ab",
                     "--workers", str(INSTANCES), "--timers", str(args.n),
                     "--rate", f"{args.rate:g}", "--seconds", f"{args.seconds:g}",
                     "--lead-ms", str(args.lead_ms), "--drain-s", f"{args.drain_s:g}",
                     *args.tickwheel_arg]  # fmt: skip
    here = machine()
    out: dict[str, Any] = {
        "bench": "compare",
        "machine": {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "nproc": here.pop("cpus"),
            **here,
        },
        "work": {
            "burst_timers": args.n,
            "steady_rate_per_s": args.rate,
            "steady_seconds": args.seconds,
            "steady_timers": int(args.rate * args.seconds),
            "lead_ms": args.lead_ms,
            "drain_s": args.drain_s,
            "instances": INSTANCES,
        },
        "peer": None,
        "tickwheel": None,
    }
    if args.only != "tickwheel":  # the peer first
        out["peer"] = measure("peer", peer_cmd, peer_summary, peer_missing(args.peer))
    if args.only != "peer":
        out["tickwheel"] = measure("tickwheel", tickwheel_cmd, tickwheel_summary)
    out["ratio"] = ratios(out["tickwheel"], out["peer"])
    out["machine"]["loadavg_after"] = machine()["loadavg"]
    print(json.dumps(out, indent=2))
    wanted = out["peer"] if args.only == "peer" else out["tickwheel"]
    return 1 if "error" in wanted else 0


if __name__ == "__main__":
    sys.exit(main())
