"""Running Kafka's Java: finding ``java``, the log4j config each JVM selects, the broker
JVM's command line and its launch (pid file written), and ``kafka-storage format`` of the
nodes' ``data/`` (a new cluster id, the SCRAM users). May import: constants, credentials,
processes.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

from .constants import (
    _TOOL_JVM_OPTS,
    DATA,
    LOGFILE,
    PIDFILE,
    SCRAM_MECHANISMS,
    USERS,
    BrokerError,
    _major,
)
from .credentials import Credentials
from .processes import _spawn


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH (and JAVA_HOME is not set): Kafka needs Java 17+")
    return java


def _logging_config(state_dir: Path, version: str, tool: bool) -> tuple[Path, str]:
    """Write the log config; return it and the JVM property that selects it."""
    level = "WARN" if tool else "INFO"
    quiet = ("kafka.server.KafkaConfig", "org.apache.kafka.common.config.AbstractConfig")
    if _major(version) >= 4:
        path = state_dir / ("tools-log4j2.properties" if tool else "log4j2.properties")
        target = "SYSTEM_ERR" if tool else "SYSTEM_OUT"
        text = [
            "appender.console.type = Console",
            "appender.console.name = console",
            f"appender.console.target = {target}",
            "appender.console.layout.type = PatternLayout",
            "appender.console.layout.pattern = [%d] %p %m (%c)%n",
            f"rootLogger.level = {level}",
            "rootLogger.appenderRef.console.ref = console",
        ]
        for i, name in enumerate(quiet):
            text += [f"logger.q{i}.name = {name}", f"logger.q{i}.level = WARN"]
        prop = f"-Dlog4j2.configurationFile={path}"
    else:
        path = state_dir / ("tools-log4j.properties" if tool else "log4j.properties")
        target = "System.err" if tool else "System.out"
        text = [
            f"log4j.rootLogger={level}, console",
            "log4j.appender.console=org.apache.log4j.ConsoleAppender",
            f"log4j.appender.console.Target={target}",
            "log4j.appender.console.layout=org.apache.log4j.PatternLayout",
            "log4j.appender.console.layout.ConversionPattern=[%d] %p %m (%c)%n",
        ]
        text += [f"log4j.logger.{name}=WARN" for name in quiet]
        prop = f"-Dlog4j.configuration=file:{path}"
    path.write_text("\n".join(text) + "\n")
    return path, prop


def _cluster_id() -> str:
    # As Kafka's own Uuid.randomUuid: an id starting with "-" would be read as an option
    # by kafka-storage (about one start in 64 failed with "expected one argument").
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def scram_arguments(credentials: Credentials | None) -> list[str]:
    """``kafka-storage format`` options that create the SCRAM users (SASL_SSL only)."""
    if credentials is None or credentials.security != "sasl_ssl":
        return []
    arguments: list[str] = []
    for mechanism in SCRAM_MECHANISMS:
        for user in USERS:
            password = credentials.passwords[user]
            arguments += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    return arguments


def _format_command(
    java: str,
    libs: Path,
    node_dir: Path,
    props: Path,
    version: str,
    cluster_id: str,
    credentials: Credentials | None,
) -> list[str]:
    _, log_prop = _logging_config(node_dir, version, tool=True)
    return [
        java,
        *_TOOL_JVM_OPTS,
        log_prop,
        "-cp",
        str(libs / "*"),
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(props),
        *scram_arguments(credentials),
    ]


def _format_storage(
    java: str,
    libs: Path,
    state_dir: Path,
    props: Path,
    version: str,
    cluster_id: str,
    credentials: Credentials | None = None,
) -> None:
    """Wipe ``data/`` and format it anew for ``cluster_id`` (an empty broker)."""
    _format_nodes(java, libs, [(state_dir, props)], version, cluster_id, credentials)


def _format_nodes(
    java: str,
    libs: Path,
    nodes: Sequence[tuple[Path, Path]],
    version: str,
    cluster_id: str,
    credentials: Credentials | None,
) -> None:
    """Wipe each (node dir, properties)'s ``data/`` and format it, all at once."""
    running: list[tuple[Path, subprocess.Popen[str]]] = []
    try:
        for node_dir, props in nodes:
            shutil.rmtree(node_dir / DATA, ignore_errors=True)
            command = _format_command(java, libs, node_dir, props, version, cluster_id, credentials)
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            running.append((node_dir, process))
        failures: list[str] = []
        for node_dir, process in running:
            output, _ = process.communicate()
            if process.returncode != 0:
                failures.append(f"{node_dir} (exit {process.returncode}):\n{output}")
        if failures:
            raise BrokerError("formatting KRaft storage failed: " + "\n".join(failures))
    finally:
        for _, process in running:
            if process.poll() is None:
                process.kill()
                process.wait()


def _jvm_argv(
    java: str, libs: Path, node_dir: Path, version: str, jvm_opts: Sequence[str]
) -> list[str]:
    _, log_prop = _logging_config(node_dir, version, tool=False)
    extra = shlex.split(os.environ.get("TICKWHEEL_KAFKA_JVM_OPTS", ""))
    props = node_dir / "server.properties"
    return [java, *jvm_opts, *extra, log_prop, "-cp", str(libs / "*"), "kafka.Kafka", str(props)]


def _launch(java: str, libs: Path, node_dir: Path, version: str, jvm_opts: Sequence[str]) -> int:
    """Spawn the broker JVM of ``node_dir`` (its server.properties written); its pid."""
    pid = _spawn(_jvm_argv(java, libs, node_dir, version, jvm_opts), node_dir / LOGFILE)
    (node_dir / PIDFILE).write_text(f"{pid}\n")
    return pid
