"""``server.properties``: what each node's says (:func:`server_properties`, a cluster's
:func:`cluster_properties`, the TLS/SASL/ACL part :func:`security_properties`,
replication for several nodes) and how it is written (mode 0600: a SASL broker's holds a
password). May import: constants, credentials, state_dir.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .constants import (
    _LOCAL_SETTINGS,
    ADMIN_USER,
    AUTHORIZER,
    BROKER_PRINCIPAL,
    BROKER_SETTINGS,
    HOST,
    NODE_ID,
    PRINCIPAL_RULES,
    SASL_MECHANISM,
    SCRAM_MECHANISMS,
    SECRETS,
    BrokerError,
    _major,
)
from .credentials import Credentials, _jaas, listener_name
from .state_dir import _write_private, node_dir


def _replication_settings(nodes: int, version: str) -> dict[str, str]:
    """A multi-node cluster's internal topics and defaults: replicated, ISR of 2 of 3."""
    if nodes <= 1:
        return {}
    factor = str(min(nodes, 3))
    isr = str(max(1, min(nodes, 3) - 1))
    settings = {
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        "transaction.state.log.min.isr": isr,
        "default.replication.factor": factor,
        "min.insync.replicas": isr,
    }
    if _major(version) >= 4:
        settings["share.coordinator.state.topic.replication.factor"] = factor
        settings["share.coordinator.state.topic.min.isr"] = isr
    return settings


def security_properties(credentials: Credentials | None) -> dict[str, str]:
    """The TLS, SASL and authorizer settings of a secured broker (none for PLAINTEXT).

    The client listener (also the inter-broker one) is ``SSL`` (client certificates
    required) or ``SASL_SSL`` (SCRAM; the brokers' own traffic as the super user).  The
    controller listener is TLS with client certificates: the brokers and controllers
    present the brokers' certificate, whose principal ``User:kafka-broker`` is a super
    user, as is ``User:admin``; every other principal has only the ACLs granted to it.
    """
    if credentials is None or credentials.security == "plaintext":
        return {}
    tls = credentials.tls
    settings = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.broker_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca),
        "ssl.principal.mapping.rules": PRINCIPAL_RULES,
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{ADMIN_USER};User:{BROKER_PRINCIPAL}",
        "allow.everyone.if.no.acl.found": "false",
    }
    if credentials.security == "ssl":
        settings["ssl.client.auth"] = "required"
        return settings
    password = credentials.passwords.get(ADMIN_USER)
    if password is None:
        raise BrokerError(f"no password for {ADMIN_USER} in {credentials.state_dir / SECRETS}")
    settings["ssl.client.auth"] = "none"
    settings["sasl.enabled.mechanisms"] = ",".join(SCRAM_MECHANISMS)
    settings["sasl.mechanism.inter.broker.protocol"] = SASL_MECHANISM
    for mechanism in SCRAM_MECHANISMS:
        key = f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config"
        settings[key] = _jaas(ADMIN_USER, password)
    return settings


def server_properties(
    state_dir: Path,
    port: int,
    controller_port: int,
    version: str,
    overrides: Mapping[str, str] | None = None,
    *,
    credentials: Credentials | None = None,
    node_id: int = NODE_ID,
    voters: Mapping[int, int] | None = None,
) -> dict[str, str]:
    """One node's ``server.properties``; ``state_dir`` is the node's dir (``data/`` in it).

    ``voters`` maps every controller's node id to its controller port (default: this
    node alone); more than one makes a replicated cluster.  ``credentials`` secure it.
    """
    voters = dict(voters or {node_id: controller_port})
    security = credentials.security if credentials is not None else "plaintext"
    listener = listener_name(security)
    controller_protocol = "PLAINTEXT" if security == "plaintext" else "SSL"
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(
            f"{node}@{HOST}:{voters[node]}" for node in sorted(voters)
        ),
        "listeners": f"{listener}://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"{listener}://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": listener,
        "listener.security.protocol.map": f"CONTROLLER:{controller_protocol},{listener}:{listener}",
        "log.dirs": str(state_dir / "data"),
        **BROKER_SETTINGS,
        **_LOCAL_SETTINGS,
    }
    if _major(version) >= 4:
        settings["share.coordinator.state.topic.replication.factor"] = "1"
        settings["share.coordinator.state.topic.min.isr"] = "1"
    settings.update(_replication_settings(len(voters), version))
    settings.update(security_properties(credentials))
    settings.update(overrides or {})
    return settings


def _write_properties(path: Path, settings: Mapping[str, str]) -> None:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n")

    lines = ["# generated by tickwheel scripts/kafka_local.py; rewritten on every start"]
    lines += [f"{key}={escape(value)}" for key, value in settings.items()]
    _write_private(path, "\n".join(lines) + "\n")  # a SASL broker's holds a password


def cluster_properties(
    state_dir: Path,
    ports: Sequence[tuple[int, int]],
    version: str,
    overrides: Mapping[str, str] | None = None,
    *,
    credentials: Credentials | None = None,
) -> dict[int, dict[str, str]]:
    """Each node's ``server.properties`` of a cluster on ``ports`` (node 1 first)."""
    voters = {node: controller for node, (_, controller) in enumerate(ports, start=1)}
    return {
        node: server_properties(
            node_dir(state_dir, node),
            client,
            controller,
            version,
            overrides,
            credentials=credentials,
            node_id=node,
            voters=voters,
        )
        for node, (client, controller) in enumerate(ports, start=1)
    }
