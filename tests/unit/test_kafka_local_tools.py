"""Kafka's own `kafka-acls.sh` for the local broker, without a JVM: the wrapper that
``kafka-local env`` puts on PATH (over the cached jars; the main class of the Kafka
version) and the super user's ``--command-config``. Run for real on the secured broker:
tests/integration/test_secured_worker.py (the README's commands)."""

from __future__ import annotations

import os
import stat
import subprocess
import zipfile
from pathlib import Path

import kafka_broker  # registered by tests/conftest.py
import pytest

script = kafka_broker.load_kafka_local()


@pytest.fixture(scope="module")
def secured_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state: Path = tmp_path_factory.mktemp("secured")
    script.ensure_credentials(state, "sasl_ssl", keep=False)
    return state


def _libs(tmp_path: Path, classes: list[str]) -> Path:
    """A jars folder whose one Kafka jar holds `classes`."""
    libs = tmp_path / "libs"
    libs.mkdir(exist_ok=True)
    with zipfile.ZipFile(libs / "kafka_2.13-x.jar", "w") as jar:
        for name in classes:
            jar.writestr(name.replace(".", "/") + ".class", b"")
    return libs


def _properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_env_puts_kafka_acls_on_path_with_the_admin_settings(
    secured_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = _libs(tmp_path, ["kafka.admin.AclCommand"])
    monkeypatch.setattr("kafka_local_parts.admin_tools.ensure_jars", lambda version: libs)
    lines = script.tool_env_lines(secured_dir, "sasl_ssl", "3.9.2")
    assert lines == [
        f'export PATH={secured_dir / "bin"}:"$PATH"',
        f"export KAFKA_ADMIN_PROPERTIES={secured_dir / 'admin.properties'}",
    ]
    tool = secured_dir / "bin" / "kafka-acls.sh"
    assert os.access(tool, os.X_OK)
    text = tool.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert f"-cp '{libs}/*' kafka.admin.AclCommand \"$@\"" in text
    admin = secured_dir / "admin.properties"
    assert stat.S_IMODE(admin.stat().st_mode) == 0o600  # it holds the super user's password
    password = (secured_dir / "secrets" / "admin.password").read_text().strip()
    assert _properties(admin) == {
        "security.protocol": "SASL_SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(secured_dir / "tls" / "ca.pem"),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        f'required username="admin" password="{password}";',
    }


def test_a_mutual_tls_admin_presents_its_certificate(
    secured_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "kafka_local_parts.admin_tools.ensure_jars", lambda version: _libs(tmp_path, [])
    )
    script.write_admin_tools(secured_dir, "ssl", "3.9.2")
    settings = _properties(secured_dir / "admin.properties")
    keystore = Path(settings["ssl.keystore.location"])
    assert settings["security.protocol"] == "SSL" and settings["ssl.keystore.type"] == "PEM"
    assert stat.S_IMODE(keystore.stat().st_mode) == 0o600
    pem = keystore.read_text()
    assert "PRIVATE KEY" in pem and pem.count("BEGIN CERTIFICATE") == 2  # its own, the CA


def test_on_kafka_4_without_its_tools_jar_the_command_says_so(
    secured_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4.x moved AclCommand to kafka-tools, which the broker's jars do not include.
    libs = _libs(tmp_path, ["kafka.admin.AclCommand"])
    monkeypatch.setattr("kafka_local_parts.admin_tools.ensure_jars", lambda version: libs)
    bin_dir = script.write_admin_tools(secured_dir, "sasl_ssl", "4.1.2")
    done = subprocess.run(
        [str(bin_dir / "kafka-acls.sh"), "--list"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "org.apache.kafka.tools.AclCommand is in the kafka-tools jar" in done.stderr
    # With the jar there, it runs it.
    libs = _libs(tmp_path, ["kafka.admin.AclCommand", "org.apache.kafka.tools.AclCommand"])
    script.write_admin_tools(secured_dir, "sasl_ssl", "4.1.2")
    assert 'org.apache.kafka.tools.AclCommand "$@"' in (bin_dir / "kafka-acls.sh").read_text()


def test_a_plaintext_broker_gets_no_admin_settings(tmp_path: Path) -> None:
    assert script._tool_lines(tmp_path, "plaintext") == []
