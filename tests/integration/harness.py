"""Worker processes and a Kafka client for the integration tests.

A `Cluster` runs `tickwheel worker` processes of one test's context (topics and consumer
group of its own) against the session's broker; they can be stopped, killed (`kill -9`)
and started again. `Client` sends commands and reads what the log and the timer table
say; `web_call` calls a worker's HTTP edge with its web token (`WEB_TOKEN`).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from app.clients.book_commands import unscoped_request_id
from app.errors import BadRecord
from app.kafka import Producer, TopicSpec, ensure_topics, read_partitions
from app.kafka.connection import Connectable, KafkaConnection
from app.kafka.records import Replication
from app.node import node_topics
from app.node.settings import Settings
from app.protocol.dead_letters import DeadLetter
from app.protocol.topics import AggregateTopics, ContextTopics
from app.protocol.wire import (
    CommandEnvelope,
    CommandResult,
    EventEnvelope,
    TimerOpAnswer,
    decode,
    encode,
)
from tables import AggregateRef, Timer, open_timer_store
from tables.partitioner import partition_of
from tables.tombstones import is_deletion_mark

ROOT = Path(__file__).resolve().parents[2]

WEB_TOKEN = "itest-token"
"""The web token of the workers a test starts with `TICKWHEEL_WEB_TOKEN=WEB_TOKEN`."""
BOOK_SERVICE = "tw_services:book_service"
"""A timer book (`<context>.book`) and the types its timers fire into."""


# The JSON of the commands' bodies as the tests write them (the rules: `tables.rules`').


class OnceJson(TypedDict):
    kind: Literal["once"]
    at: int


class IntervalJson(TypedDict):
    kind: Literal["interval"]
    start: int
    every: int
    coalesce: NotRequired[bool]


class TimerJson(TypedDict):
    """A timer as a `Schedule` command's body (or one of `ScheduleMany`'s) writes it."""

    key: str
    rule: OnceJson | IntervalJson
    target: NotRequired[dict[str, object]]


def new_context() -> str:
    return "t" + uuid.uuid4().hex[:10]


def free_port() -> int:
    """A port nothing listens on now, for a worker's HTTP edge."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Worker:
    def __init__(
        self, name: str, proc: subprocess.Popen[bytes], log: Path, port: int | None = None
    ) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.port = port

    def text(self) -> str:
        """The worker's log: for a failure's message, not for its state (`health`)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def health(self, timeout: float = 2) -> dict[str, Any] | None:
        """What its `/healthz` says (200 or 503), or None while it does not answer."""
        if self.port is None:
            raise AssertionError(f"{self.name} runs without an HTTP port")
        url = f"http://127.0.0.1:{self.port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                body: dict[str, Any] = orjson.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = orjson.loads(exc.read())
        except (OSError, ValueError):
            return None
        return body

    def metrics(self, timeout: float = 5) -> list[tuple[str, dict[str, str], float]] | None:
        """Every sample its `/metrics` exports (name, labels, value), or None while it does
        not answer."""
        if self.port is None:
            raise AssertionError(f"{self.name} runs without an HTTP port")
        url = f"http://127.0.0.1:{self.port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                text = response.read().decode()
        except (OSError, ValueError):
            return None
        return [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` (as exported, e.g. `..._total`) whose labels
        include `labels`: 0 while nothing was counted, or while the worker does not answer."""
        samples = self.metrics() or []
        return sum(
            v
            for n, ls, v in samples
            if n == name and all(ls.get(k) == x for k, x in labels.items())
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets and state but does nothing, as in a long GC
        pause or a network partition; after `thaw` it runs on, not knowing it lost anything."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill9(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30) -> int:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def connection_of(variables: Mapping[str, str]) -> KafkaConnection:
    """The connection that the `KAFKA_*` variables (`kafka-local env`'s) give a node."""
    return Settings.from_env(variables).kafka


class Cluster:
    """Workers of one context; each with its own data directory, as separate machines.

    On a secured broker: `env` holds the workers' `KAFKA_*` variables (the user they run
    as) and `kafka` how the harness's own clients connect (`Client`, `run_cli`'s default is
    the workers' env); `replication` is what `Client` creates the topics with (the workers
    create them with their settings')."""

    def __init__(
        self,
        bootstrap: str,
        base: Path,
        *,
        context: str | None = None,
        partitions: int = 4,
        env: dict[str, str] | None = None,
        service: str = "tw_services:service",
        kafka: Connectable | None = None,
        replication: Replication | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.kafka: Connectable = bootstrap if kafka is None else kafka
        self.replication = replication
        self.base = base
        self.context = context or new_context()
        self.partitions = partitions
        self.group = f"g-{self.context}"
        self.service = service
        self.env = env or {}
        self.workers: list[Worker] = []
        self._count = 0

    worker_module = "app.cli"
    """What `python -m` runs as a worker (the benchmarks run a traced one)."""

    def worker_env(self, name: str) -> dict[str, str]:
        """Environment a subclass adds for the worker `name`."""
        return {}

    def process_env(
        self, data: Path, extra: Mapping[str, str] | None = None, /, **env: str
    ) -> dict[str, str]:
        """The environment of a worker (or a command) of this cluster keeping its data in
        `data`: `extra` under the cluster's `env`, `env` over both."""
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "integration"), str(ROOT)]),
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "TICKWHEEL_PARTITIONS": str(self.partitions),
            "TICKWHEEL_DATA_DIR": str(data),
            "TICKWHEEL_GROUP_ID": self.group,
            "TICKWHEEL_SESSION_TIMEOUT_MS": "6000",
            "TW_TEST_CONTEXT": self.context,
            **(extra or {}),
            **self.env,
            **env,
        }

    def start_worker(self, name: str | None = None, **env: str) -> Worker:
        self._count += 1
        name = name or f"w{self._count}"
        data = self.base / name
        data.mkdir(parents=True, exist_ok=True)
        log = self.base / f"{name}-{self._count}.log"
        port = free_port()
        full_env = {
            "TICKWHEEL_WEB_PORT": str(port),
            **self.process_env(data, self.worker_env(name), **env),
        }
        cmd = [sys.executable, "-m", self.worker_module, "worker", "--service", self.service]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT
            )
        worker = Worker(name, proc, log, int(full_env["TICKWHEEL_WEB_PORT"]) or None)
        self.workers.append(worker)
        return worker

    async def web_worker(self) -> Worker:
        """A worker started with `WEB_TOKEN` (for `web_call`), once it owns partitions."""
        worker = self.start_worker(TICKWHEEL_WEB_TOKEN=WEB_TOKEN)
        await self.wait_owned(worker)
        return worker

    async def wait_owned(self, worker: Worker, within: float = 60) -> None:
        """Until `worker` says it owns partitions (or fails with its log)."""
        await eventually(lambda: _owns(worker), within, f"{worker.name} never owned a partition")

    async def local_rows(
        self, worker: Worker, keys: list[tuple[AggregateRef, str]], aggregate: str = "counter"
    ) -> dict[tuple[str, str], Timer | None]:
        """The rows a stopped worker's own RocksDB timer table holds for `keys`."""
        directory = self.base / worker.name / f"{self.context}.{aggregate}" / "timers"
        store = open_timer_store(f"rocksdb://{directory}", partitions=self.partitions)
        try:
            return {(o.id, k): await store.find(o, k) for o, k in keys}
        finally:
            await store.close()

    async def run_cli(
        self, args: Sequence[str], *, within: float = 90, **env: str
    ) -> tuple[int, str, str, float]:
        """Runs `tickwheel ARGS` as an operator would (another process, the workers' env
        unless `env` overrides it): its exit code, stdout, stderr and how long it took."""
        data = self.base / "cli"
        data.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app.cli",
            *args,
            cwd=ROOT,
            env=self.process_env(data, **env),
            stdin=subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), within)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(
                f"tickwheel {' '.join(args)} still running after {within} s"
            ) from None
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode(), time.monotonic() - began

    def stop_all(self) -> None:
        for w in self.workers:
            w.stop()


async def web_call(
    worker: Worker, method: str, path: str, body: Any = None, **headers: str
) -> tuple[int, Any]:
    """`method path` on `worker`'s HTTP edge with `WEB_TOKEN`, `body` as JSON: its status
    and its JSON answer."""
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method,
            f"http://127.0.0.1:{worker.port}{path}",
            json=body,
            headers={"Authorization": f"Bearer {WEB_TOKEN}", **headers},
        ) as r,
    ):
        return r.status, await r.json()


def book_cluster(bootstrap: str, base: Path) -> Iterator[Cluster]:
    """A cluster of `BOOK_SERVICE` workers over 2 partitions, stopped after (a fixture's:
    `yield from book_cluster(kafka_bootstrap, tmp_path)`)."""
    cluster = Cluster(bootstrap, base, partitions=2, service=BOOK_SERVICE)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def owned(worker: Worker) -> list[int]:
    """The partitions `worker` owns and runs now, by its `/healthz` ([] while it does not
    answer or restores one)."""
    health = worker.health()
    if health is None or health["restoring"]:
        return []
    return [int(p) for p in health["owned"]]


def _owns(worker: Worker) -> bool:
    if not worker.alive:
        raise AssertionError(f"{worker.name} exited {worker.proc.returncode}:\n{worker.text()}")
    return bool(owned(worker))


def sent_base(request_id: str) -> str:
    """A sent command's request id without its sender's digest
    (`app.model.aggregate.sent_request_id`), nor the scope a timer change's id is given
    (`app.clients.book_commands.scoped_request_id`): `<request id>>n`, as a test names it."""
    return unscoped_request_id(re.sub(r"@[0-9a-f]{16}$", "", request_id))


async def eventually(
    check: Callable[[], bool] | Callable[[], Awaitable[bool]],
    within: float,
    message: str,
    interval: float = 0.2,
) -> None:
    """Polls `check` until true; the broker is another process, so polling it is the only way."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s: {message}")
        await asyncio.sleep(interval)


async def sleep_until(epoch_ms: int) -> None:
    """Waits for a wall-clock instant itself (a timer's due time), not for a state."""
    await asyncio.sleep(max(0.0, epoch_ms / 1000 - time.time()))


class Client:
    """Sends commands to a cluster's context and reads its topics."""

    def __init__(self, cluster: Cluster, aggregate: str = "counter") -> None:
        self.cluster = cluster
        self.topics = AggregateTopics(cluster.context, aggregate)
        self.ctx = ContextTopics(cluster.context)
        self._producer = Producer(cluster.kafka)

    async def __aenter__(self) -> Client:
        await ensure_topics(
            self.cluster.kafka,
            node_topics([self.topics], self.cluster.partitions),
            self.cluster.replication,
        )
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()

    def ref(self, aggregate_id: str) -> AggregateRef:
        return AggregateRef(
            context=self.topics.context, aggregate=self.topics.aggregate, id=aggregate_id
        )

    def command(
        self,
        aggregate_id: str,
        type_: str,
        body: Mapping[str, object] | None = None,
        *,
        request_id: str | None = None,
        not_before: int | None = None,
    ) -> CommandEnvelope:
        return CommandEnvelope(
            request_id=request_id or uuid.uuid4().hex,
            type=type_,
            aggregate=self.ref(aggregate_id),
            body=dict(body or {}),
            not_before=not_before,
            issued_at=int(time.time() * 1000),
        )

    async def send(self, *commands: CommandEnvelope) -> None:
        await self._producer.send_many(
            [
                (
                    self.topics.commands,
                    partition_of(c.aggregate.id, self.cluster.partitions),
                    c.aggregate.id.encode(),
                    encode(c),
                )
                for c in commands
            ]
        )

    async def send_raw(self, partition: int, key: bytes, value: bytes) -> None:
        await self._producer.send(self.topics.commands, key, value, partition)

    async def write_events(self, *events: EventEnvelope) -> None:
        """Writes events to the log as another language's service would."""
        await self._producer.send_many(
            [
                (
                    self.topics.events,
                    partition_of(e.aggregate.id, self.cluster.partitions),
                    e.aggregate.id.encode(),
                    encode(e),
                )
                for e in events
            ]
        )

    async def _read_all(self, topic: str, partitions: Iterable[int]) -> list[bytes]:
        out: list[bytes] = []
        async for batch in read_partitions(self.cluster.kafka, topic, partitions):
            out += [r.value for r in batch if r.value is not None]
        return out

    async def results(self) -> dict[str, CommandResult]:
        out: dict[str, CommandResult] = {}
        for r in await self.all_results():
            out[r.request_id] = r
        return out

    async def all_results(self) -> list[CommandResult]:
        """The commands' results: the owners' answers to timer ops left out."""
        raw = await self._read_all(self.ctx.results, range(self.cluster.partitions))
        return [decode(CommandResult, v) for v in raw if _op_answer(v) is None]

    async def op_answers(self) -> list[TimerOpAnswer]:
        """The owners' answers to operators' timer ops, on the results topic."""
        raw = await self._read_all(self.ctx.results, range(self.cluster.partitions))
        return [a for a in map(_op_answer, raw) if a is not None]

    async def events(self) -> list[EventEnvelope]:
        raw = await self._read_all(self.topics.events, range(self.cluster.partitions))
        return [decode(EventEnvelope, v) for v in raw]

    async def dead_letters(self) -> list[DeadLetter]:
        """The context's dead letters, in the order they were written."""
        letters: list[DeadLetter] = []
        async for batch in read_partitions(self.cluster.kafka, self.ctx.dead_letters, [0]):
            letters += [DeadLetter.read(r.key, r.value, r.headers) for r in batch]
        return letters

    async def timers(self) -> dict[bytes, Timer]:
        """The timer table as its changelog has it (the latest row per key), but owners'
        deletion marks, which are no timers (`tables.tombstones`)."""
        rows: dict[bytes, Timer] = {}
        for key, history in (await self.changelog_history()).items():
            if not is_deletion_mark(history[-1]):
                rows[key] = history[-1]
        return rows

    async def changelog_history(self) -> dict[bytes, list[Timer]]:
        """Every committed row of the timer table's changelog, per key, in log order."""
        rows: dict[bytes, list[Timer]] = {}
        parts = range(self.cluster.partitions)
        async for batch in read_partitions(self.cluster.kafka, self.topics.timers_changelog, parts):
            for r in batch:
                if r.key is not None and r.value is not None:
                    rows.setdefault(r.key, []).append(Timer.model_validate_json(r.value))
        return rows

    async def wait_results(
        self, request_ids: Iterable[str], within: float = 60
    ) -> dict[str, CommandResult]:
        wanted = set(request_ids)
        found: dict[str, CommandResult] = {}

        async def check() -> bool:
            nonlocal found
            found = await self.results()
            return wanted <= set(found)

        await eventually(check, within, f"results for {len(wanted)} commands")
        return {k: found[k] for k in wanted}


__all__ = [
    "Client",
    "Cluster",
    "TopicSpec",
    "Worker",
    "connection_of",
    "eventually",
    "new_context",
    "owned",
    "sleep_until",
]


def kcat_produce(bootstrap: str, topic: str, partition: int, key: bytes, value: bytes) -> None:
    """Writes one record whose header key is the bytes ff fe (not UTF-8), as any producer
    that is not Python's may: kcat hands librdkafka the key's bytes as they are."""
    assert shutil.which("kcat"), "kcat is not installed: apt-get install kcat"
    args = [b"kcat", b"-b", bootstrap.encode(), b"-P", b"-t", topic.encode()]
    args += [b"-p", str(partition).encode(), b"-k", key, b"-H", b"\xff\xfe=team-a"]
    run = subprocess.run(
        args,
        input=value,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")


def _op_answer(value: bytes) -> TimerOpAnswer | None:
    try:
        return decode(TimerOpAnswer, value, new_names=False)
    except BadRecord:
        return None
