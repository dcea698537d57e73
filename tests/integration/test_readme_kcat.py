"""The README's kcat example, run as written against the session's broker: the record lands
in the partition Kafka's default partitioner (murmur2) gives its key, where the node reads it
as a timer of its aggregate, not a misrouted record (issue 10, item 2)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from app.commands.processor import misrouted
from app.kafka import ensure_topics, read_partitions
from app.node import node_topics
from app.node.settings import Settings
from app.protocol.topics import parse_aggregate_type
from app.protocol.wire import EventEnvelope, decode
from tables.partitioner import partition_of

pytestmark = pytest.mark.kafka

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def kcat_block() -> str:
    sh_blocks: list[str] = re.findall(r"```sh\n(.*?)```", README, flags=re.S)
    blocks = [b for b in sh_blocks if "kcat " in b]
    assert len(blocks) == 1, "the README shows one kcat example"
    return blocks[0]


async def test_the_readmes_kcat_example_lands_in_its_aggregates_partition(
    kafka_bootstrap: str,
) -> None:
    # scripts/test installs kcat (Debian's package) where it is missing.
    assert shutil.which("kcat"), "kcat is not installed: apt-get install kcat"
    partitions = Settings().partitions  # the default, as the README's worker runs with
    shop_order = parse_aggregate_type("shop.order")
    await ensure_topics(kafka_bootstrap, node_topics([shop_order], partitions))
    run = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        kcat_block(),
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(run.communicate(), 60)
    assert run.returncode == 0, stderr.decode()
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
