"""The docs' kcat commands (docs/wire-format.md), run as written against the session's
broker: the example
record lands in the partition Kafka's default partitioner (murmur2) gives its key, where the
node reads it as a timer of its aggregate, not a misrouted record (issue 10, item 2); and the
dead-letter command prints a letter as the docs show it: the bad record's own key and
value, and where it came from and why in its headers."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
from harness import Client, Cluster, eventually

from app.commands.processor import misrouted
from app.kafka import ensure_topics, existing_topics, read_partitions
from app.node import node_topics
from app.node.settings import Settings
from app.protocol.dead_letters import HEADER_PREFIX
from app.protocol.topics import parse_aggregate_type
from app.protocol.wire import EventEnvelope, decode
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE = (ROOT / "docs" / "wire-format.md").read_text()
"""The page that shows the kcat commands (the README's reference on the wire)."""
DEMO = "app.demo:service"


def kcat_block(mode: str) -> str:
    """The page's one code block that runs kcat in `mode` (-P produces, -C consumes)."""
    sh_blocks: list[str] = re.findall(r"```sh\n(.*?)```", PAGE, flags=re.S)
    blocks = [b for b in sh_blocks if f"kcat {mode} " in b]
    assert len(blocks) == 1, f"docs/wire-format.md shows one kcat {mode} example"
    return blocks[0]


def test_every_kcat_command_of_the_docs_is_run_here() -> None:
    """The two of docs/wire-format.md, and no other page shows one."""
    sh_blocks: list[str] = re.findall(r"```sh\n(.*?)```", PAGE, flags=re.S)
    assert [b for b in sh_blocks if "kcat " in b] == [kcat_block("-P"), kcat_block("-C")]
    for page in DOCS:
        if page.name != "wire-format.md":
            assert "kcat -" not in "".join(
                re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S)
            ), page


async def run_block(block: str, bootstrap: str) -> tuple[bytes, bytes]:
    """Runs a docs block in bash as written; its stdout and stderr (it must succeed)."""
    run = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        block,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode == 0, stderr.decode(errors="replace")
    return stdout, stderr


@pytest.mark.kafka_next
async def test_the_readmes_kcat_example_lands_in_its_aggregates_partition(
    kafka_bootstrap: str,
) -> None:
    # scripts/test installs kcat (Debian's package) where it is missing.
    assert shutil.which("kcat"), "kcat is not installed: apt-get install kcat"
    partitions = Settings().partitions  # the default, as the docs' worker runs with
    shop_order = parse_aggregate_type("shop.order")
    await ensure_topics(kafka_bootstrap, node_topics([shop_order], partitions))
    await run_block(kcat_block("-P"), kafka_bootstrap)
    found = []
    async for records in read_partitions(kafka_bootstrap, shop_order.events, range(partitions)):
        for r in records:
            if r.value is not None and b'"evt-1"' in r.value:
                found.append((r, decode(EventEnvelope, r.value)))
    assert found, "the example's record is in the log"
    for record, event in found:
        assert record.partition == partition_of("o-42", partitions)
        assert misrouted(record, event.aggregate, partitions) is None
        assert event.type == "wow.ScheduleSet"
        assert event.body["rule"]["at"] > time.time() * 1000, "due in the future"


def readme_letter() -> list[bytes]:
    """The letter the docs show the dead-letter command print: headers, key, value."""
    after = PAGE[PAGE.index(kcat_block("-C")) :]
    texts: list[str] = re.findall(r"```text\n(.*?)```", after, flags=re.S)
    assert texts, "the docs show a letter after their dead-letter command"
    lines = texts[0].encode().splitlines()
    assert len(lines) == 3, "a letter in three lines: %h, %k, %s"
    return lines


def header_fields(line: bytes) -> list[tuple[str, str]]:
    """`%h`'s `name=value,…` of our own headers, in order (a value may hold a comma, so
    split where the next of ours begins)."""
    parts = re.split(rb",(?=__tickwheel\.errors\.)", line)
    fields = [p.decode().split("=", 1) for p in parts if p.startswith(HEADER_PREFIX.encode())]
    return [(k.removeprefix(HEADER_PREFIX), v) for k, v in fields]


async def test_the_readmes_dead_letter_command_prints_the_letter_it_shows(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The docs' bad event (the kcat example's, its `at` past 9999), written to the
    log of a running `shop.order` worker: the docs' kcat command prints its letter
    as the docs show it (the bad record's key and value as written)."""
    assert shutil.which("kcat"), "kcat is not installed: apt-get install kcat"
    shown_headers, key, value = readme_letter()
    shown = dict(header_fields(shown_headers))
    partitions = Settings().partitions  # the docs' worker's, as in the letter shown
    cluster = Cluster(
        kafka_bootstrap, tmp_path, context="shop", partitions=partitions, service=DEMO
    )
    try:
        async with Client(cluster, "order") as client:
            w = cluster.start_worker()
            await cluster.wait_owned(w)
            partition = partition_of(key.decode(), partitions)
            offset = await client._producer.send(client.topics.events, key, value, partition)

            async def lettered() -> bool:
                return any(
                    (d.topic, d.partition, d.offset) == (client.topics.events, partition, offset)
                    for d in await client.dead_letters()
                )

            await eventually(lettered, 60, f"a dead letter of {client.topics.events}@{offset}")
    finally:
        cluster.stop_all()
    stdout, _ = await run_block(kcat_block("-C"), kafka_bootstrap)
    lines = stdout.splitlines()
    where = (b"__tickwheel.errors.topic=shop.order.events,", f"offset={offset},".encode())
    (at,) = [i for i, line in enumerate(lines) if all(w in line for w in where)]
    printed = header_fields(lines[at])
    assert [k for k, _ in printed] == list(shown), "the headers the docs show, in order"
    got = dict(printed)
    for name in ("topic", "partition", "stage", "exception.class.name", "exception.message"):
        assert got[name] == shown[name], (name, got[name], shown[name])
    assert int(got["offset"]) == offset
    assert lines[at + 1] == key, "the bad record's key"
    assert lines[at + 2] == value, "the bad record's value, byte for byte"


@pytest.mark.kafka_next
async def test_the_readmes_dead_letter_command_creates_no_topic(kafka_bootstrap: str) -> None:
    """Read-only: the docs' command, its topic one that does not exist, says so and
    fails, and leaves no topic behind (kcat's consumer never asks for one to be created:
    librdkafka's `allow.auto.create.topics` is false for consumers)."""
    assert shutil.which("kcat"), "kcat is not installed: apt-get install kcat"
    missing = f"t{uuid.uuid4().hex[:10]}.dead-letters"
    block = kcat_block("-C")
    assert block.count("-t shop.dead-letters ") == 1
    run = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        block.replace("-t shop.dead-letters ", f"-t {missing} "),
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode != 0 and stdout == b""
    assert b"Unknown topic or partition" in stderr, stderr
    assert await existing_topics(kafka_bootstrap, [missing]) == {}
