"""The docs on connecting to Kafka against the code: the README's managed-cluster example is
read as written, and docs/configuration.md's table of the topics a node creates is what
it creates. (The README's `kafka-acls.sh` commands run on the secured broker:
tests/integration/test_secured_worker.py.)"""

from __future__ import annotations

import re
import shlex
import ssl
from pathlib import Path

import pytest
from fakes import ROOT

from app.kafka.admin import topic_configs
from app.kafka.records import Replication
from app.node.kept import node_topics
from app.node.settings import Settings
from app.protocol.dead_letters import DEAD_LETTER_TOPIC_BYTES
from app.protocol.topics import parse_aggregate_type

README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def exports(block: str) -> dict[str, str]:
    words = [shlex.split(line, comments=True) for line in block.splitlines()]
    return dict(w[1].split("=", 1) for w in words if w and w[0] == "export")


def test_the_managed_cluster_example_is_a_sasl_ssl_connection_trusting_the_systems_cas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = [
        b for b in re.findall(r"```sh\n(.*?)```", README, re.S) if "KAFKA_SASL_MECHANISM=" in b
    ]
    (block,) = blocks
    variables = exports(block)
    monkeypatch.chdir(tmp_path)
    Path(variables["KAFKA_SASL_PASSWORD_FILE"]).write_text("the password\n")
    kafka = Settings.from_env(variables).kafka
    options = kafka.options()
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_password"] == "the password"
    context = options["ssl_context"]
    assert kafka.ssl_cafile is None  # the system's CAs, verified, the host name checked
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def _topics_table() -> dict[str, str]:
    section = CONFIGURATION.split("### The topics a node creates\n", 1)[1].split("\n#", 1)[0]
    return {
        m[1]: m[2]
        for line in section.splitlines()
        if (m := re.match(r"\| `([^`]+)` \| ([^|]+) \|", line))
    }


def test_the_docs_list_each_topic_a_node_creates_with_its_configs() -> None:
    table = _topics_table()
    specs = node_topics([parse_aggregate_type("ctx.agg")], 12)
    assert set(table) == {s.name for s in specs}
    used = Replication(3, 2)
    for spec in specs:
        configs = topic_configs(spec, used)
        assert configs.pop("min.insync.replicas") == "2"  # every topic: said above the table
        said = table[spec.name].strip()
        if not configs:
            assert said == "the cluster's defaults", spec.name
        else:
            written = dict(re.findall(r"`([a-z.]+)=([^`]+)`", said))
            assert written == configs, spec.name
    assert f"max.message.bytes={DEAD_LETTER_TOPIC_BYTES}" in table["ctx.dead-letters"]
