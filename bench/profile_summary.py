"""Summarises py-spy's raw (collapsed) stacks: where a worker's CPU time goes.

    python -m bench.profile_summary /tmp/prof/burst.txt [--top 25]

Each line of the file is `frame;frame;…;leaf count` (py-spy `--format raw`; idle samples
are not recorded). `self` counts the samples a function was the leaf of, `total` those it
was anywhere on the stack; functions are named `name (file)`, lines merged. `groups`
puts every sample under the first of a few areas its stack passes through.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")

# Checked leaf-first: a sample counts for the innermost area its stack is in.
GROUPS = [
    ("pydantic validate / construct", ("pydantic", "model_validate", "model_copy")),
    ("pydantic serialise (model_dump)", ("model_dump",)),
    ("orjson", ("orjson",)),
    (
        "rocksdb",
        (
            "rocksdict",
            "rocksdb_store.py",
            "rocksdb_reads.py",
            "rocksdb_io.py",
            "aggregate_store.py",
        ),
    ),
    ("aiokafka producer", ("aiokafka/producer",)),
    ("aiokafka consumer / fetch", ("aiokafka/consumer",)),
    (
        "aiokafka records / protocol / conn",
        ("aiokafka/record", "aiokafka/protocol", "aiokafka/conn", "aiokafka/client"),
    ),
    ("asyncio event loop", ("asyncio/",)),
    ("logging", ("logging/",)),
]


# Checked in list order: a sample counts for the first step whose function is anywhere on
# its stack (so a step nested in another is listed before it).
STAGES = [
    # A partition's cycle, most specific first: its in-process timers (asked for,
    # decided, settled), the log's records and the commands read, then the rest of it.
    (
        "cycle: in-process timers settled (PartitionCycles._record_local)",
        ("_record_local (app/node/cycles.py",),
    ),
    (
        "cycle: in-process timers decided (CommandProcessor.decide_local)",
        ("decide_local (app/commands/processor.py",),
    ),
    (
        "cycle: in-process timers asked for (still_due, timer_command)",
        ("still_due (app/timers/runner", "timer_command (app/timers/sender.py"),
    ),
    (
        "subscription: log → timer table (PartitionCycles._subscribe)",
        ("_subscribe (app/node/cycle_timers.py",),
    ),
    (
        "command path: commands read (CommandProcessor.decide_records)",
        ("decide_records (app/commands/processor.py",),
    ),
    ("cycle: the rest (staging, timer operations)", ("_cycle (app/node/cycles.py",)),
    (
        "commit landed: aggregate states written, metrics (PartitionCycles._batch_committed)",
        ("_batch_committed (app/node/cycles.py",),
    ),
    (
        "commit: records encoded and sent (TransactionalProducer)",
        ("app/kafka/transactional_producer.py", "app/kafka/producer_loop.py"),
    ),
    ("partition commits: the rest (Commits)", ("app/node/commits.py",)),
    (
        "runner: due/claim/outcomes (TimerRunner.partition_round)",
        ("partition_round (app/timers/runner/runner.py", "round (app/timers/runner/runner.py"),
    ),
    (
        "runner: a send (TimerRunner._send_one, KafkaSender)",
        ("_send_one (app/timers/runner", "send (app/timers/sender.py"),
    ),
    ("results reader (ResultsReader._run)", ("_run (app/timers/sender.py",)),
    ("consumer poll / offsets (poll_loop)", ("poll_loop (app/node/polling.py",)),
    ("aiokafka producer tasks (produce + txn requests)", ("aiokafka/producer/",)),
    ("aiokafka fetcher task", ("aiokafka/consumer/fetcher.py",)),
    ("aiokafka connection reads", ("aiokafka/conn.py",)),
]


def _name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{m.group('name')} ({file})"


def summarize(path: Path, top: int = 20) -> dict[str, Any]:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [f for f in stack.split(";") if f]
        names = [_name(f) for f in frames]
        if names:
            own[names[-1]] += n
        for name in set(names):
            total[name] += n
        for label, needles in STAGES:
            if any(any(nd in f for nd in needles) for f in frames):
                stages[label] += n
                break
        else:
            stages["other (event loop, tracing, …)"] += n
        for label, needles in GROUPS:
            if any(any(nd in f for nd in needles) for f in frames[-3:]):
                groups[label] += n
                break
        else:
            groups["other (app/, tables/, …)"] += n

    def pct(c: Counter[str], k: int) -> list[list[Any]]:
        return [[name, round(100 * v / max(1, samples), 1)] for name, v in c.most_common(k)]

    # The trunk every sample shares (runpy, typer, the event loop) says nothing: only the
    # project's own functions and its libraries' entry points are listed inclusively.
    own_code = Counter(
        {k: v for k, v in total.items() if "(app/" in k or "(tables/" in k or "(bench/" in k}
    )
    return {
        "samples": samples,
        "stage_pct": pct(stages, len(STAGES) + 1),
        "self_pct": pct(own, top),
        "total_pct_app_tables": pct(own_code, top),
        "leaf_area_pct": pct(groups, len(GROUPS) + 1),
    }


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(json.dumps(summarize(args.path, args.top), indent=2))


if __name__ == "__main__":
    cli()
