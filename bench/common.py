"""What the end-to-end benchmarks share: the broker, worker clusters, tails, CPU figures.

The benchmarks run real `tickwheel worker` processes (the integration tests' `Cluster`,
serving `tests/integration/tw_services.py`'s `counter` aggregate) against a real broker:
`KAFKA_BOOTSTRAP_SERVERS` when set, else one the project starts itself, as the tests do
(`tests/kafka_broker.py`: Docker when it answers, else `scripts/kafka_local.py`). Every
client of the bench connects as `broker()`'s `KafkaConnection` says: with
`KAFKA_BOOTSTRAP_SERVERS` set, the same `KAFKA_*` security variables as a node's (TLS,
SASL; the workers inherit them), read by the node's own settings; its own broker is
PLAINTEXT.

Everything the bench process itself measures is read back from Kafka by tail consumers
in this process (never from the workers' memory), so a figure is what a client sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from app.kafka.connection import Connectable, KafkaConnection, client_options
from app.node.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION = ROOT / "tests" / "integration"
if str(INTEGRATION) not in sys.path:
    sys.path.insert(0, str(INTEGRATION))

from harness import Client, Cluster, Worker, owned  # noqa: E402

__all__ = [
    "Client",
    "Cluster",
    "CpuMeter",
    "Producer",
    "Profiler",
    "Tail",
    "TracedCluster",
    "Worker",
    "admin_client",
    "broker",
    "connection_for",
    "delete_context_topics",
    "group_committed",
    "machine",
    "new_bench_context",
    "owned",
    "percentiles",
    "wait_stable",
]


def _kafka_broker() -> ModuleType:
    """tests/kafka_broker.py, loaded by its path (tests/ is not a package)."""
    name = "kafka_broker"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "kafka_broker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def broker() -> Iterator[KafkaConnection]:
    """A real broker: the given one, or one started (and stopped); how to connect to it."""
    with _kafka_broker().bootstrap_servers() as bootstrap:
        yield connection_for(bootstrap, os.environ)


def connection_for(bootstrap: str, environ: Mapping[str, str]) -> KafkaConnection:
    """The connection to `bootstrap`: the node's own settings read from `environ` (its
    `KAFKA_*` security variables, one place) when `KAFKA_BOOTSTRAP_SERVERS` names the
    broker; PLAINTEXT for one the bench started."""
    if environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip() != bootstrap:
        return KafkaConnection(bootstrap_servers=bootstrap)
    return Settings.from_env(environ).kafka


def new_bench_context(kind: str) -> str:
    """A context (topic prefix, consumer group) of this run's own."""
    return f"bench{kind}{uuid.uuid4().hex[:8]}"


async def delete_context_topics(kafka: Connectable, context: str) -> None:
    """Deletes the topics of a bench context (the broker is shared: leave it as found)."""
    admin = AIOKafkaAdminClient(**client_options(kafka), request_timeout_ms=30_000)
    try:
        await admin.start()
        names = [t for t in await admin.list_topics() if t.startswith(context + ".")]
        if names:
            await admin.delete_topics(names)
    except Exception:  # best effort
        pass
    finally:
        await admin.close()


# --------------------------------------------------------------------------- figures


def percentiles(samples_ms: Sequence[float]) -> dict[str, float | int]:
    """count, p50, p90, p99, p99.9 and max of millisecond samples."""
    if not samples_ms:
        return {"count": 0}
    s = sorted(samples_ms)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(len(s) * q))], 1)

    return {
        "count": len(s),
        "p50_ms": round(statistics.median(s), 1),
        "p90_ms": at(0.90),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "max_ms": round(s[-1], 1),
    }


def code_version() -> str:
    """The commit the product code is at, `+dirty` when app/ or tables/ differ from it
    (other people edit the tree while benchmarks run: say what was measured)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "app", "tables"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "code": code_version(),
    }


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process, in seconds (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def broker_pid(bootstrap: str) -> int | None:
    """The pid of the process listening on the bootstrap port (this machine's broker)."""
    try:
        port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
            for line in list(f)[1:]:
                parts = line.split()
                if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{parts[9]}]")
    if not inodes:
        return None
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                        return int(entry)
    return None


class CpuMeter:
    """CPU spent during a phase: each named process's, this process's, and the machine's.

    `other_cores` is what the machine spent beyond the processes named here and this one
    (other engineers' tests, the OS): the load the figures were taken under.
    """

    def __init__(self, processes: dict[str, int | None]) -> None:
        self._pids = {name: pid for name, pid in processes.items() if pid is not None}

    def __enter__(self) -> CpuMeter:
        self._wall = time.monotonic()
        self._own = time.process_time()
        self._procs = {n: _proc_cpu_s(p) for n, p in self._pids.items()}
        self._busy, self._total = _machine_jiffies()
        self._load = os.getloadavg()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self.figures = self.read()

    def read(self) -> dict[str, Any]:
        wall = time.monotonic() - self._wall
        busy, total = _machine_jiffies()
        cores = os.cpu_count() or 1
        machine_cores = (busy - self._busy) / max(1, total - self._total) * cores
        spent: dict[str, float] = {}
        for name, pid in self._pids.items():
            before, after = self._procs.get(name), _proc_cpu_s(pid)
            if before is not None and after is not None:
                spent[name] = after - before
        spent["bench"] = time.process_time() - self._own
        known = sum(spent.values()) / max(wall, 1e-9)
        return {
            "wall_s": round(wall, 2),
            "cores_used": {n: round(s / max(wall, 1e-9), 2) for n, s in spent.items()},
            "cpu_s": {n: round(s, 3) for n, s in spent.items()},
            "machine_cores_busy": round(machine_cores, 2),
            "other_cores": round(max(0.0, machine_cores - known), 2),
            "loadavg_1m": [round(self._load, 2), round(os.getloadavg()[0], 2)],
        }


# --------------------------------------------------------------------------- cluster


class TracedCluster(Cluster):
    """A `Cluster` whose workers run `bench.traced_worker` (the same worker, its steps timed
    into `<base>/<name>-trace.json`) under `bench.txn_steps` (each transaction's steps into
    `<base>/<name>-txn.jsonl`); otherwise started exactly as the harness starts them."""

    worker_module = "bench.txn_steps"

    def worker_env(self, name: str) -> dict[str, str]:
        return {
            "TW_TRACE_FILE": str(self.trace_path(name)),
            "TW_TXN_STEPS_FILE": str(self.txn_steps_path(name)),
        }

    def trace_path(self, name: str) -> Path:
        return self.base / f"{name}-trace.json"

    def txn_steps_path(self, name: str) -> Path:
        return self.base / f"{name}-txn.jsonl"


class WarmCluster(Cluster):
    """A `Cluster` whose workers run under `bench.txn_steps` untraced: for its experiments
    (`TW_WARM_TOPICS`)."""

    worker_module = "bench.txn_steps"


async def wait_stable(workers: Sequence[Worker], partitions: int, within: float = 120) -> float:
    """Until the alive workers own all partitions between them, each a share, none twice
    (as their logs last said); how long it took."""
    began = time.monotonic()
    deadline = began + within
    while True:
        for w in workers:
            if not w.alive:
                raise RuntimeError(f"{w.name} exited {w.proc.returncode}:\n{w.text()[-3000:]}")
        shares = [set(owned(w)) for w in workers]
        union = set().union(*shares)
        if (
            union == set(range(partitions))
            and all(shares)
            and sum(len(s) for s in shares) == partitions
        ):
            return time.monotonic() - began
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers never settled: {shares}")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def admin_client(kafka: Connectable) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(**client_options(kafka), request_timeout_ms=30_000)
    try:
        await admin.start()
        yield admin
    finally:
        await admin.close()


async def group_committed(admin: AIOKafkaAdminClient, group: str, topic: str) -> dict[int, int]:
    """The consumer group's committed offsets of `topic`, per partition."""
    got = await admin.list_consumer_group_offsets(group)
    return {tp.partition: om.offset for tp, om in got.items() if tp.topic == topic}


# --------------------------------------------------------------------------- Kafka


class Producer:
    """The bench's own producer: `send` hands a record over without waiting for its ack."""

    def __init__(self, kafka: Connectable, *, linger_ms: int = 1) -> None:
        self._p = AIOKafkaProducer(
            **client_options(kafka),
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_batch_size=256 * 1024,
        )
        self._futures: list[asyncio.Future[Any]] = []

    async def start(self) -> None:
        await self._p.start()

    async def stop(self) -> None:
        await self._p.stop()

    async def send(self, topic: str, partition: int, key: bytes, value: bytes) -> None:
        self._futures.append(await self._p.send(topic, value, key=key, partition=partition))

    async def flush(self) -> dict[int, int]:
        """Waits for every record sent so far; the next offset after them per partition."""
        await self._p.flush()
        ends: dict[int, int] = {}
        for f in self._futures:
            md = await f
            ends[md.partition] = max(ends.get(md.partition, 0), md.offset + 1)
        self._futures.clear()
        return ends


OnRecords = Callable[[int, list[Any], float], None]


class Tail:
    """Reads the committed records of `topic`'s partitions from their end as of `start()`,
    handing each fetched batch to `on_records(partition, records, received_at)`."""

    def __init__(
        self, kafka: Connectable, topic: str, partitions: Iterable[int], on_records: OnRecords
    ) -> None:
        self.topic = topic
        self._tps = [TopicPartition(topic, p) for p in partitions]
        self._on = on_records
        self._c = AIOKafkaConsumer(
            **client_options(kafka),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=100,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        self._task: asyncio.Task[None] | None = None
        self.records = 0

    async def start(self) -> None:
        await self._c.start()
        self._c.assign(self._tps)
        await self._c.seek_to_end(*self._tps)
        for tp in self._tps:
            await self._c.position(tp)  # fixes the start now, not at the first fetch
        self._task = asyncio.create_task(self._run(), name=f"tail {self.topic}")

    async def _run(self) -> None:
        while True:
            got = await self._c.getmany(timeout_ms=200, max_records=10_000)
            now = time.time()
            for tp, ms in got.items():
                self.records += len(ms)
                self._on(tp.partition, ms, now)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._c.stop()


class Profiler:
    """py-spy recording a worker while a phase runs (raw collapsed stacks)."""

    def __init__(self, directory: str | None, pid: int, name: str) -> None:
        self.path = None if directory is None else Path(directory) / f"{name}.txt"
        self._pid = pid
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profiler:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            self._proc = subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(self._pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--nonblocking",
                    "-o",
                    str(self.path),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()


async def wait_until(check: Callable[[], bool], within: float, interval: float = 0.05) -> bool:
    """Polls `check` until true or `within` seconds passed; whether it came true."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True


def now_ms() -> int:
    return int(time.time() * 1000)


def run_and_print(run: Callable[[KafkaConnection, Path, Any], Any], args: Any, prefix: str) -> None:
    """A benchmark's main: a broker, `run(kafka, base, args)`, the figures as JSON
    (with the profiles summarised when `--profile` was given), the scratch folder removed
    unless `--dir` named it."""
    import json
    import tempfile

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with broker() as kafka:
            figures = asyncio.run(run(kafka, base, args))
        if args.profile:
            from bench.profile_summary import summarize

            figures["profile"] = {
                p.stem: summarize(p, top=15) for p in sorted(Path(args.profile).glob("*.txt"))
            }
        print(json.dumps(figures, indent=2))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
