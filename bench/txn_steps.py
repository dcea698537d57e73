"""Each transaction of a worker's transactional producers, step by step (a bench-only hook).

    TW_TXN_STEPS_FILE=/tmp/w1-txn.jsonl python -m bench.txn_steps worker --service …

`bench.traced_worker` tells how long `TransactionalProducer._commit` takes in total; this
tells where inside it the time goes. aiokafka's producer and its sender (the background
task that sends one transactional request at a time) are wrapped, not changed: each
`TransactionalProducer.commit` becomes one JSON line with its steps, in ms from the
commit's start: our `_append` and `_commit`; aiokafka's metadata waits, coordinator
lookups, AddPartitionsToTxn, produce requests, AddOffsetsToTxn, TxnOffsetCommit,
the flush before EndTxn, EndTxn, each request with the error the broker answered (a retry
after a backoff) or `ok`; and the event loop's lag seen meanwhile (a 5 ms sleep that woke
late: the loop ran something else). The product code is not changed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import os
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

_CURRENT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "tw_txn_steps", default=None
)
# transactional id -> the commit going (the sender's task has no context of the caller's)
_OPEN: dict[str, dict[str, Any]] = {}
_LAGS: deque[tuple[float, float]] = deque(maxlen=4096)  # (monotonic at wake, lag in ms)
_OUT: list[IO[str] | None] = [None]
_MONITOR: list[asyncio.Task[None] | None] = [None]

LAG_TICK_S = 0.005
LAG_KEPT_MS = 3.0


def _ms(record: dict[str, Any], at: float) -> float:
    return round((at - float(record["t"])) * 1e3, 2)


def _step(record: dict[str, Any] | None, label: str, began: float, detail: str = "") -> None:
    if record is None:
        return
    step = [label, _ms(record, began), _ms(record, time.perf_counter())]
    if detail:
        step.append(detail)
    record["steps"].append(step)


def _for_txn(txn_id: str | None) -> dict[str, Any] | None:
    return None if txn_id is None else _OPEN.get(txn_id)


_TICK = [time.perf_counter()]  # when the loop last ran the lag monitor


async def _lag_monitor() -> None:
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LAG_TICK_S)
        woke = _TICK[0] = time.perf_counter()
        lag = (woke - before - LAG_TICK_S) * 1e3
        if lag >= LAG_KEPT_MS:
            _LAGS.append((woke, round(lag, 1)))


BLOCK_MS = 40.0
"""A loop that has not run the monitor for this long is looked at (`_watch_blocks`)."""


def _watch_blocks(path: str, main: int) -> None:
    """A thread: while the loop is held (no tick for `BLOCK_MS`), samples the main
    thread's stack every 20 ms, and at the end writes the block as a JSON line: its wall
    time, the process's CPU meanwhile (near the wall time: the loop was busy; far below:
    it waited on a system call or for a core), and the distinct stacks (our frames and
    the innermost ones)."""
    import sys
    import traceback

    with open(path, "a", encoding="utf-8", buffering=1) as out:
        while True:
            time.sleep(0.01)
            last = _TICK[0]
            if (time.perf_counter() - last) * 1e3 < BLOCK_MS:
                continue
            cpu0, began = time.process_time(), last
            stacks: dict[str, int] = {}
            while _TICK[0] == last:
                frame = sys._current_frames().get(main)
                if frame is not None:
                    frames = traceback.extract_stack(frame)
                    ours = [
                        f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}"
                        for f in frames
                        if "/app/" in f.filename or "/tables/" in f.filename
                    ]
                    inner = [
                        f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames[-3:]
                    ]
                    key = " > ".join([*ours[-6:], "|", *inner])
                    stacks[key] = stacks.get(key, 0) + 1
                time.sleep(0.02)
            end = time.perf_counter()
            out.write(
                json.dumps(
                    {
                        "at": time.time() - (time.perf_counter() - began),
                        "wall_ms": round((end - began) * 1e3, 1),
                        "cpu_ms_from_detection": round((time.process_time() - cpu0) * 1e3, 1),
                        "stacks": sorted(stacks.items(), key=lambda kv: -kv[1])[:6],
                    }
                )
                + "\n"
            )


def _close(record: dict[str, Any], error: BaseException | None) -> None:
    end = time.perf_counter()
    record["total_ms"] = _ms(record, end)
    if error is not None:
        record["error"] = repr(error)
    began = record["t"]
    # A lag ends when its sleep woke: it overlaps the commit if it woke after its start.
    record["loop_lags_ms"] = [
        [_ms(record, woke), lag] for woke, lag in list(_LAGS) if began < woke <= end
    ]
    del record["t"]
    out = _OUT[0]
    if out is not None:
        out.write(json.dumps(record) + "\n")


def _wrap_commit(owner: Any) -> None:
    original = owner.commit

    @functools.wraps(original)
    async def commit(self: Any, records: Any, offsets: Any, group_id: str) -> Any:
        if _MONITOR[0] is None:
            _MONITOR[0] = asyncio.get_running_loop().create_task(_lag_monitor())
        record: dict[str, Any] = {
            "id": self.transactional_id,
            "at": time.time(),
            "t": time.perf_counter(),
            "records": len(records),
            "topics": sorted({f"{r[0]}[{r[1]}]" for r in records}),
            "offsets": len(offsets),
            "steps": [],
        }
        _OPEN[self.transactional_id] = record
        token = _CURRENT.set(record)
        error: BaseException | None = None
        try:
            return await original(self, records, offsets, group_id)
        except BaseException as exc:
            error = exc
            raise
        finally:
            _CURRENT.reset(token)
            if _OPEN.get(self.transactional_id) is record:
                del _OPEN[self.transactional_id]
            _close(record, error)

    owner.commit = commit


def _wrap_caller_step(owner: Any, name: str, label: str) -> None:
    """A coroutine method run in the caller's task (the commit's context)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        record = _CURRENT.get()
        began = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            _step(record, label, began)

    setattr(owner, name, timed)


def _wrap_metadata_wait(client_type: Any) -> None:
    original = client_type._wait_on_metadata

    @functools.wraps(original)
    async def timed(self: Any, topic: str) -> Any:
        record = _CURRENT.get()
        if record is None or self.cluster.partitions_for_topic(topic) is not None:
            return await original(self, topic)
        began = time.perf_counter()
        try:
            return await original(self, topic)
        finally:
            _step(record, "metadata fetch (topic unknown to the producer)", began, topic)

    client_type._wait_on_metadata = timed


def _error_of(resp: Any) -> str:
    """The first error a transactional response carries, by name (`ok`: none)."""
    from aiokafka import errors

    codes: list[int] = []
    if hasattr(resp, "error_code"):
        codes.append(resp.error_code)
    for topic in getattr(resp, "errors", ()) or ():
        for partition in topic[1]:
            codes.append(partition[1])
    bad = [c for c in codes if c]
    return errors.for_code(bad[0]).__name__ if bad else "ok"


def _wrap_handler(handler: Any, label: str) -> None:
    """An aiokafka sender handler's `do` (one request and its answer, then a backoff
    sleep if the answer asks for a retry), in the sender's task."""
    do, handle = handler.do, handler.handle_response

    @functools.wraps(handle)
    def handle_response(self: Any, resp: Any) -> Any:
        self._tw_answer = _error_of(resp)
        return handle(self, resp)

    @functools.wraps(do)
    async def timed(self: Any, node_id: int) -> Any:
        txn = self._sender._txn_manager
        record = _for_txn(getattr(txn, "transactional_id", None))
        began = time.perf_counter()
        self._tw_answer = "no answer"
        try:
            return await do(self, node_id)
        finally:
            _step(record, label, began, getattr(self, "_tw_answer", ""))

    handler.handle_response = handle_response
    handler.do = timed


def _wrap_sender_step(owner: Any, name: str, label: str, cached: Callable[..., bool]) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    async def timed(self: Any, *args: Any) -> Any:
        txn = getattr(self, "_txn_manager", None)
        record = _for_txn(getattr(txn, "transactional_id", None))
        if record is None or cached(self, *args):
            return await original(self, *args)
        began = time.perf_counter()
        try:
            return await original(self, *args)
        finally:
            _step(record, label, began, " ".join(str(a) for a in args))

    setattr(owner, name, timed)


def install(path: str) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.client import AIOKafkaClient
    from aiokafka.producer import message_accumulator, sender

    from app.kafka.transactional_producer import TransactionalProducer

    _OUT[0] = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (the process's)
    _wrap_commit(TransactionalProducer)
    _wrap_caller_step(TransactionalProducer, "_append", "ours: _append (sends queued)")
    _wrap_caller_step(TransactionalProducer, "_commit", "ours: _commit (offsets + EndTxn)")
    _wrap_caller_step(AIOKafkaProducer, "begin_transaction", "aiokafka: begin_transaction")
    _wrap_caller_step(
        AIOKafkaProducer, "send_offsets_to_transaction", "aiokafka: send_offsets_to_transaction"
    )
    _wrap_caller_step(AIOKafkaProducer, "commit_transaction", "aiokafka: commit_transaction")
    _wrap_metadata_wait(AIOKafkaClient)
    _wrap_handler(sender.AddPartitionsToTxnHandler, "req AddPartitionsToTxn")
    _wrap_handler(sender.AddOffsetsToTxnHandler, "req AddOffsetsToTxn")
    _wrap_handler(sender.TxnOffsetCommitHandler, "req TxnOffsetCommit (group coordinator)")
    _wrap_handler(sender.EndTxnHandler, "req EndTxn")
    _wrap_handler(sender.SendProduceReqHandler, "req Produce")
    _wrap_sender_step(
        sender.Sender,
        "_find_coordinator",
        "FindCoordinator (not cached)",
        lambda self, kind, key: kind in self._coordinators,
    )
    flush = message_accumulator.MessageAccumulator.flush_for_commit

    @functools.wraps(flush)
    async def flush_for_commit(self: Any) -> Any:
        record = _for_txn(getattr(self._txn_manager, "transactional_id", None))
        began = time.perf_counter()
        try:
            return await flush(self)
        finally:
            _step(record, "flush_for_commit (batches acked)", began)

    message_accumulator.MessageAccumulator.flush_for_commit = flush_for_commit


def read(path: str) -> list[dict[str, Any]]:
    """The transactions written to `path` so far (a line cut short at the end is left)."""
    out: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    break
    except OSError:
        pass
    return out


def around(path: str, t0_ms: int, first: int = 6) -> dict[str, Any]:
    """What a worker's transactions did about `t0_ms` (a burst's due time): those in flight
    at t0, and the first `first` (by start) of the transactions started after it, one per
    transactional id (each partition's first of the burst), times from t0 in ms."""
    t0 = t0_ms / 1000

    def shown(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "at": round((r["at"] - t0) * 1e3, 1), "id": r["id"].rsplit(".", 3)[-3:]}

    txns = read(path)
    in_flight = [r for r in txns if r["at"] < t0 < r["at"] + r.get("total_ms", 0) / 1e3]
    firsts: dict[str, dict[str, Any]] = {}
    for r in sorted(txns, key=lambda r: float(r["at"])):
        if r["at"] >= t0 and r["id"] not in firsts:
            firsts[r["id"]] = r
    until = max((r["at"] + r.get("total_ms", 0) / 1e3 for r in firsts.values()), default=t0)
    blocks = [
        {**b, "at": round((b["at"] - t0) * 1e3, 1)}
        for b in read(path.replace(".jsonl", "-blocks.jsonl"))
        if t0 - 1 <= b["at"] <= until
    ]
    return {
        "loop_held_from_t0_1s_to_first_commits_end": blocks,
        "in_flight_at_t0": [shown(r) for r in in_flight],
        "first_of_each_partition": [shown(r) for r in list(firsts.values())[:first]],
        "first_totals_ms": sorted(r.get("total_ms", 0) for r in firsts.values()),
    }


def main() -> None:
    from bench import producer_experiments

    producer_experiments.install(os.environ)
    path = os.environ.get("TW_TXN_STEPS_FILE")
    if path:
        install(path)
        import threading

        threading.Thread(
            target=_watch_blocks,
            args=(path.replace(".jsonl", "-blocks.jsonl"), threading.get_ident()),
            daemon=True,
        ).start()
    if os.environ.get("TW_TRACE_FILE"):
        from bench import traced_worker

        traced_worker.main()
    else:
        from app.cli import main as cli_main

        cli_main()


if __name__ == "__main__":
    main()
