"""The constants every other module shares, and the few helpers under them all.

The pinned Kafka version, JVM options, ports and timeouts, users and security settings,
the broker settings, the state dir's file names; :class:`BrokerError`; ``_say`` (progress
on stderr); and the paths: :func:`kafka_version`, :func:`cache_root`,
:func:`default_state_dir`. Imports no sibling module (everything else imports this one).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

KAFKA_VERSION = "3.9.2"
"""The pinned Apache Kafka version (``org.apache.kafka:kafka_2.13``)."""

SCALA_VERSION = "2.13"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

# Logging bindings that the binary distribution ships but the Maven POMs leave out.
_LOGGING_DEPS_3 = (
    ("org.slf4j", "slf4j-reload4j", "1.7.36"),
    ("ch.qos.reload4j", "reload4j", "1.2.25"),
)
_LOGGING_DEPS_4 = (("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3"),)

JVM_OPTS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:-OmitStackTraceInFastThrow",
    "-Djava.awt.headless=true",
)
_TOOL_JVM_OPTS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
)

CLUSTER_JVM_OPTS: tuple[str, ...] = ("-Xms128m", "-Xmx256m", *JVM_OPTS[2:])
"""Each JVM of a multi-node cluster (``start --brokers 3``): a 256 MiB heap."""

HOST = "127.0.0.1"
NODE_ID = 1
MAX_NODES = 9
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_CLUSTER_START_TIMEOUT = 180.0
DEFAULT_STOP_TIMEOUT = 20.0

SECURITY_PROTOCOLS = ("plaintext", "ssl", "sasl_ssl")
"""``start --security``: PLAINTEXT, TLS with client certificates, or SCRAM over TLS."""
ADMIN_USER = "admin"
"""The super user (``super.users``); the brokers' own inter-broker traffic uses it too."""
APP_USER = "tickwheel"
"""A user with no ACLs at all: tests grant it exactly what they mean to (``grant``)."""
USERS = (ADMIN_USER, APP_USER)
BROKER_PRINCIPAL = "kafka-broker"
"""The CN (so the principal ``User:kafka-broker``, a super user) of the brokers' certificate."""
SASL_MECHANISM = "SCRAM-SHA-512"
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PRINCIPAL_RULES = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
"""A client certificate's ``CN=name`` is the principal ``User:name``."""
TLS = "tls"
"""The state dir's certificates: ``ca.pem``, ``broker.pem`` (key + chain), ``USER.crt/.key``."""
SECRETS = "secrets"
"""The state dir's generated passwords, one file per user (``USER.password``, mode 0600)."""
OIDC = "oidc"
"""The state dir's token server (a SASL_SSL broker's OAUTHBEARER): its signing key, pid,
port and log."""
CERT_DAYS = 3650

BROKER_SETTINGS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}
"""Settings shared by every test broker (this script's, and the Docker one in tests/)."""

_LOCAL_SETTINGS: dict[str, str] = {
    "num.network.threads": "2",
    "num.io.threads": "4",
    "background.threads": "4",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
}

PIDFILE = "kafka.pid"
INFOFILE = "broker.json"
LOGFILE = "broker.log"
CLUSTERFILE = "cluster.json"
"""Kept across stops: the cluster id, ports, Kafka version and ``--set`` settings."""
DATA = "data"
_META = "meta.properties"
_LOCKFILE = ".lock"


class BrokerError(RuntimeError):
    """The broker could not be resolved, started or stopped."""


def _say(message: str) -> None:
    print(f"kafka-local: {message}", file=sys.stderr, flush=True)


def kafka_version() -> str:
    return os.environ.get("TICKWHEEL_KAFKA_VERSION") or KAFKA_VERSION


def cache_root() -> Path:
    configured = os.environ.get("TICKWHEEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tickwheel"


def default_state_dir() -> Path:
    return Path(os.environ.get("TICKWHEEL_STATE") or "/tmp/tickwheel-kafka")


def _major(version: str) -> int:
    return int(version.split(".", 1)[0])
