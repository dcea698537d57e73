"""`tickwheel worker` with wall-clock timers around the steps of the command and firing paths.

    TW_TRACE_FILE=/tmp/w1-trace.json python -m bench.traced_worker worker --service …

A sampling profiler (py-spy) tells where the CPU goes; this tells where the *time* goes
when the worker waits (on the broker, on a lock, on a transaction). Each wrapped coroutine
adds its count, total and longest wall time under a label; the totals are written as JSON
to `TW_TRACE_FILE` every half second (cumulative, so that a bench diffs two snapshots).
The product code is not changed: its classes' methods are wrapped before the CLI starts.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

_STATS: dict[str, list[float]] = {}
_VALUES: dict[str, list[float]] = {}


def _add(label: str, seconds: float) -> None:
    s = _STATS.get(label)
    if s is None:
        s = _STATS[label] = [0, 0.0, 0.0]
    s[0] += 1
    s[1] += seconds
    if seconds > s[2]:
        s[2] = seconds


def _count(label: str, value: float) -> None:
    v = _VALUES.get(label)
    if v is None:
        v = _VALUES[label] = [0, 0.0]
    v[0] += 1
    v[1] += value


def _wrap(
    owner: Any, name: str, label: str, on_result: Callable[[Any], None] | None = None
) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            result = await original(*args, **kwargs)
        finally:
            _add(label, time.perf_counter() - began)
        if on_result is not None:
            on_result(result)
        return result

    setattr(owner, name, timed)


def install() -> None:
    from app.kafka import group_consumer, producers, transactional_producer
    from app.node import cycles, partition_transaction
    from app.timers import sender
    from app.timers.runner import outcomes, runner, sending
    from tables import partitioned

    def round_stats(stats: Any) -> None:
        if stats.loaded:
            _count("round.loaded", stats.loaded)
            _count("round.claimed", stats.claimed)

    cycle = cycles.PartitionCycles
    _wrap(cycle, "_cycle", "cycles._cycle: one partition cycle (decide and stage)")
    _wrap(cycle, "_subscribe", "cycles._subscribe: a log batch into the timer table")
    _wrap(group_consumer.GroupConsumer, "poll", "consumer.poll")
    _wrap(
        partition_transaction.Transaction,
        "send",
        "txn.send: a partition's commit (incl. lock wait)",
    )
    _wrap(
        transactional_producer.TransactionalProducer,
        "_commit",
        "txn._commit: offsets + EndTxn round trips",
    )
    _wrap(producers.Producer, "send_many", "producer.send_many: a command to the broker (ack)")
    _wrap(partitioned.PartitionedStore, "put", "store.put")
    _wrap(partitioned.PartitionedStore, "settle", "store.settle (incl. store lock + sink)")
    _wrap(
        partitioned.PartitionedStore, "_commit", "store._commit: sink (changelog append) + RocksDB"
    )
    _wrap(partitioned.PartitionedStore, "due", "store.due")
    _wrap(
        runner.TimerRunner,
        "_claim",
        "runner._claim: due → claim (a round's first half)",
        lambda r: round_stats(r.stats),
    )
    _wrap(runner.TimerRunner, "_finish", "runner._finish: sends → outcomes → sweep")
    _wrap(runner.TimerRunner, "_settle_exactly", "runner claim write (settle of the claims)")
    _wrap(outcomes.Outcomes, "flush", "runner outcome write (settle of the outcomes)")
    _wrap(runner.TimerRunner, "record_outcomes", "runner in-process outcome write")
    _wrap(sending.Sends, "_send_one", "runner._send_one (incl. in-flight gate wait)")
    _wrap(sender.KafkaSender, "send", "sender.send: command sent → its result read")


def experiments(names: str) -> None:
    """Product changes tried without editing the product (`TW_EXPERIMENT`, comma separated),
    to measure what a proposed fix would gain before anyone makes it:

    - `batch1m`: the workers' producers batch up to 1 MiB per partition and request
      (aiokafka's default is 16 KiB, and with idempotence one request is in flight per
      broker, so a transaction of 1,000 events to one partition goes out as ~25
      produce requests one after another).
    - `results_key_first`: the node's results reader looks the record's key (the request
      id) up among the sends waiting for a result before decoding it, instead of
      decoding every result of its partitions (most are not its own sends' results).
    - `changelog_linger`: the timer table's changelog producers (transactional id
      `<group>.<ctx>.<agg>.timers.<p>`) linger 50 ms instead of 1 ms, so that the rows of
      one commit interval go out in a few produce requests instead of about one per
      store write (a commit still sends what waits at once: aiokafka closes the batches).
    """
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name == "changelog_linger":
            from app.kafka import transactional_producer

            # The module's global, looked up when a producer is made (another
            # experiment's replacement, if one ran first).
            original = vars(transactional_producer)["AIOKafkaProducer"]

            def lingering(*args: Any, original: Any = original, **kwargs: Any) -> Any:
                if ".timers." in (kwargs.get("transactional_id") or ""):
                    kwargs["linger_ms"] = 50
                return original(*args, **kwargs)

            vars(transactional_producer)["AIOKafkaProducer"] = lingering
        elif name == "results_key_first":
            from app.errors import BadRecord
            from app.protocol.wire import CommandResult, decode
            from app.timers import sender

            async def _run(self: Any) -> None:
                while True:
                    for record in await self._reader.poll():
                        rid = record.key.decode() if record.key is not None else None
                        if rid is not None and rid not in self._waiting:
                            continue
                        try:
                            result = decode(CommandResult, record.value)
                        except BadRecord:
                            continue
                        future = self._waiting.pop(result.request_id, None)
                        if future is not None and not future.done():
                            future.set_result(result)

            sender.ResultsReader._run = _run  # type: ignore[method-assign]
        elif name == "batch1m":
            from app.kafka import producers, transactional_producer

            # Both modules make aiokafka producers: the plain one's and the partitions'.
            for module in (producers, transactional_producer):
                vars(module)["AIOKafkaProducer"] = functools.partial(
                    vars(module)["AIOKafkaProducer"], max_batch_size=1 << 20
                )
        else:
            raise SystemExit(f"unknown experiment {name!r}")


def _snapshot() -> dict[str, Any]:
    return {
        "at": time.time(),
        "timed": {k: list(v) for k, v in list(_STATS.items())},
        "counted": {k: list(v) for k, v in list(_VALUES.items())},
    }


def _dump_forever(path: str) -> None:
    while True:
        time.sleep(0.5)
        try:
            data = json.dumps(_snapshot())
        except RuntimeError:  # changed while copied: next time
            continue
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(tmp, path)


def diff(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two snapshots: per label count, mean and max (ms), and
    `busy` = total time / wall time (how many were in progress on average)."""
    before = before or {"at": after["at"], "timed": {}, "counted": {}}
    wall = max(1e-9, after["at"] - before["at"])
    timed = {}
    for label, (n, total, longest) in sorted(after["timed"].items()):
        n0, total0, _ = before["timed"].get(label, [0, 0.0, 0.0])
        if n - n0 <= 0:
            continue
        timed[label] = {
            "count": int(n - n0),
            "mean_ms": round((total - total0) / (n - n0) * 1e3, 2),
            "max_ms_ever": round(longest * 1e3, 1),
            "busy": round((total - total0) / wall, 2),
        }
    counted = {}
    for label, (n, total) in sorted(after["counted"].items()):
        n0, total0 = before["counted"].get(label, [0, 0.0])
        if n - n0 > 0:
            counted[label] = {"count": int(n - n0), "mean": round((total - total0) / (n - n0), 1)}
    return {"wall_s": round(wall, 2), "timed": timed, "counted": counted}


def read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            snapshot: dict[str, Any] = json.load(f)
            return snapshot
    except (OSError, ValueError):
        return None


def main() -> None:
    path = os.environ.get("TW_TRACE_FILE")
    install()
    experiments(os.environ.get("TW_EXPERIMENT", ""))
    if path:
        threading.Thread(target=_dump_forever, args=(path,), daemon=True).start()
    from app.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
