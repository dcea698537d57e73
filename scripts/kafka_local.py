#!/usr/bin/env python3
"""A real Apache Kafka (KRaft, combined broker+controller nodes), without Docker.

One node by default; a cluster of several (``--brokers 3``); PLAINTEXT by default, or
secured (``--security ssl|sasl_ssl``: TLS, SCRAM users, ACLs).

The broker is Apache Kafka's own jars, resolved once from Maven Central with the
machine's ``mvn`` and cached under ``${TICKWHEEL_CACHE:-~/.cache/tickwheel}/kafka-<version>/libs``
(a marker file records success, so later runs never call Maven again), started with
the machine's ``java`` (17+).

Usage (``scripts/kafka-local`` is a wrapper around this file)::

    kafka_local.py start   [--dir DIR] [--fresh] [--port N] [--timeout S] [--set key=value ...]
                           [--security plaintext|ssl|sasl_ssl] [--brokers N]
    kafka_local.py start   [--dir DIR] --node N   # start one node of a cluster again
    kafka_local.py restart [--dir DIR] [--node N] [--timeout S]
    kafka_local.py stop    [--dir DIR] [--node N] [--timeout S]
    kafka_local.py kill    [--dir DIR] [--node N] # SIGKILL: a crash
    kafka_local.py status  [--dir DIR]
    kafka_local.py env     [--dir DIR] [--user admin|tickwheel]  # export KAFKA_...=...
    kafka_local.py grant   [--dir DIR] [--user U] (--topic T | --group G |
                           --transactional-id X | --cluster) [--prefixed] --operation OP ...
    kafka_local.py fetch                         # only resolve the jars, print their folder

The broker keeps its data between starts, like a real one.  The first ``start`` in a
state dir formats its storage (a new random cluster id, an empty log); every later
``start`` serves the same ``data/`` (topics, records, committed offsets, transactions)
with the same cluster id on the same port, which the state dir remembers in
``cluster.json``.  If that port is taken by something else, ``start`` fails with an error
naming it (``--port N`` moves the broker to another port; its data is kept); only a dir
with no remembered port gets a free one.  ``start --fresh`` wipes ``data/`` and formats
anew: an empty broker with a new cluster id (on the remembered port if it is free, else on
a free one).  If a broker is already running in DIR, ``start`` prints its address and
leaves it alone (``--fresh`` stops and wipes it).

``start`` and ``restart`` print progress on stderr, with a hint line
``export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT``, and the bootstrap address
``127.0.0.1:PORT`` as the last line on stdout once the broker answers a Metadata request
(scripts read it with ``tail -n 1``).  ``restart`` stops the broker and starts it again on
the same dir and port with its data, Kafka version and ``--set`` settings (to try recovery
after a broker outage); it fails on a dir where no broker was ever started.  ``stop``
sends SIGTERM to the broker's process group, waits (20 s by default), then SIGKILL; the
data stays.  ``status`` prints ``running 127.0.0.1:PORT pid=... kafka=... cluster=...
dir=...`` (exit 0), ``unresponsive ...`` (exit 1) or ``stopped`` (exit 3).  ``env`` prints
``export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT`` for the running broker, for
``eval "$(scripts/kafka-local env)"`` (exit 3 and a message on stderr if it is stopped).

The state dir (``--dir``, default ``${TICKWHEEL_STATE:-/tmp/tickwheel-kafka}``) holds
``server.properties`` (rewritten on every start), the logging config, ``data/``
(log.dirs, with Kafka's ``meta.properties`` naming the cluster id), ``cluster.json``
(kept across stops: cluster id, port, controller port, Kafka version, ``--set``
settings, security, node count and ports), ``broker.log`` (the broker's stdout/stderr
since its last start), ``kafka.pid`` and ``broker.json`` (pid, address, version of the
running broker); a secured broker's ``tls/`` and ``secrets/`` too (below).

Security (``start --security``; a kept broker keeps its own, changing it takes
``--fresh``).  ``ssl``: the client listener is TLS and requires a client certificate
(``CN=name`` is the principal ``User:name``).  ``sasl_ssl``: SCRAM-SHA-512 and -256 over
TLS, no client certificate; the SCRAM users are created when the storage is formatted
(``kafka-storage format --add-scram``), and the brokers' own inter-broker traffic
authenticates as ``admin``.  Both: ``StandardAuthorizer`` with
``allow.everyone.if.no.acl.found=false``; super users ``User:admin`` and
``User:kafka-broker`` (the brokers' certificate: the controller listener is TLS with client
certificates among the nodes, never PLAINTEXT); the user ``tickwheel`` has no ACL until
one is granted (``grant``, or :func:`grant`, which waits until every node applies it).
The first secured start makes, with the machine's ``openssl``, a CA, the brokers'
certificate (``localhost``, ``127.0.0.1``) and a client certificate per user in ``tls/``
(PEM; the brokers read ``tls/broker.pem``, key and chain, with ``ssl.keystore.type=PEM``),
and a random password per user in ``secrets/USER.password``; private keys, passwords and
``server.properties`` are mode 0600.  They are kept across starts and ``--fresh``.
``env`` prints every variable a client needs: ``KAFKA_BOOTSTRAP_SERVERS``,
``KAFKA_SECURITY_PROTOCOL`` (``SSL``/``SASL_SSL``), ``KAFKA_SSL_CAFILE``, then
``KAFKA_SSL_CERTFILE`` and ``KAFKA_SSL_KEYFILE`` (ssl) or ``KAFKA_SASL_MECHANISM``
(``SCRAM-SHA-512``), ``KAFKA_SASL_USERNAME`` and ``KAFKA_SASL_PASSWORD_FILE`` (sasl_ssl);
``env --user tickwheel`` the same for that user; then, for Kafka's own ``kafka-acls.sh``
(the jars ship no ``bin/``: it is written in ``DIR/bin``, running the cached jars),
``export PATH=DIR/bin:"$PATH"`` and ``KAFKA_ADMIN_PROPERTIES`` (``DIR/admin.properties``,
mode 0600: the super user's client settings, for ``--command-config``).  This script's
own readiness probe speaks TLS and SCRAM too (stdlib only).

Clusters (``start --brokers 3``): every node is a broker and a controller in its own JVM
(256 MiB heap) with its own dir ``node-N/`` (properties, ``data/``, log, pid), client and
controller ports (``--port P``: node N on ``P+N-1``), ``controller.quorum.voters`` of all;
``default.replication.factor=3``, ``min.insync.replicas=2`` and internal topics replicated
3 times.  The address printed lists every node.  ``start`` is ready when every node lists
every node in Metadata; ``start`` on a cluster some of whose nodes run starts the others.
``stop`` stops every node at once (SIGKILL for those still up :data:`STRAGGLER_GRACE`
seconds after the first exited: without a quorum they may wait for ever); ``stop``,
``kill`` (SIGKILL, a crash), ``start`` and ``restart`` with ``--node N`` act on one node,
which keeps its data and ports.  ``status`` prints a summary (``running``, ``degraded``
when a node is down: exit 1, ``stopped``) and a line per node.

Broker settings: 127.0.0.1 only (PLAINTEXT unless secured), on the port chosen as above,
the controller listener on another port (remembered too, but replaced by a free one if it
is taken: clients never see it; the voters are static config); replication factor 1
everywhere (but in a cluster: above);
``auto.create.topics.enable=false`` (tests and the application create their topics
explicitly, with the partition count they need, so a typo never creates a stray
1-partition topic); ``group.initial.rebalance.delay.ms=0``; small internal topics (4
partitions) and ``group.min.session.timeout.ms=1000`` so that failover tests can use
short consumer session timeouts.

Environment: ``TICKWHEEL_KAFKA_VERSION`` overrides the pinned version (for trying
others; 4.x works too: ``scripts/test`` runs the Kafka tests again on 4.1.2),
``TICKWHEEL_KAFKA_JVM_OPTS`` adds JVM options (e.g. a bigger heap), ``JAVA_HOME`` picks
the JVM.

As a module (stdlib only)::

    broker = kafka_local.start(state_dir)   # -> Broker(bootstrap="127.0.0.1:PORT", ...)
    broker = kafka_local.restart(state_dir) # stop + start: same data and address
    ...
    broker.stop()

    broker = kafka_local.start(state_dir, security="sasl_ssl")
    broker.client_settings("tickwheel")     # the KAFKA_* variables, as `env --user` prints
    kafka_local.grant(state_dir, "tickwheel", "topic", "orders", ["read", "describe"])

    cluster = kafka_local.start_cluster(state_dir, nodes=3)  # -> Cluster(bootstrap="a,b,c")
    cluster.kill_node(2); cluster.start_node(2)
    cluster.stop()

The library's ``start`` is *fresh by default* (``fresh=True``): tests and benchmarks
(tests/kafka_broker.py) get an empty broker every run.  ``start(state_dir, fresh=False)``
keeps the data as the CLI does; ``restart`` always keeps it and returns the new
:class:`Broker` (the old one is stopped).  A library ``start`` holds a lock on its state
dir until ``stop`` (a second live process gets a clear error instead of killing the first
one's broker), stops any broker left in that dir by a process that died, and stops its
own broker at interpreter exit if ``stop`` was never called; so does ``start_cluster``
(its :class:`Cluster` holds the lock; the module's ``start_node`` in another process
then fails on it, ``stop_node`` and ``kill_node`` do not need it).
"""

# ruff: noqa: E402  (the package imports follow the sys.path line below)
from __future__ import annotations

import sys
from pathlib import Path

# The code is in the package next to this file (kafka_local_parts/, one module per
# concept); this file stays the entry point and the module that users import. Tests load
# it by its path, so it puts its own folder on sys.path to find the package.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from kafka_local_parts.acls import (
    CLUSTER_RESOURCE,
    OPERATIONS,
    PATTERNS,
    RESOURCE_TYPES,
    Acl,
    create_acls,
    describe_acls,
    encode_create_acls,
    grant,
    parse_describe_acls,
)
from kafka_local_parts.admin_tools import (
    ACL_COMMAND,
    ADMIN_PROPERTIES,
    BIN,
    admin_properties,
    tool_env_lines,
    write_admin_tools,
)
from kafka_local_parts.broker import Broker, check_restartable, resolve_security, restart, start
from kafka_local_parts.cli import _tool_lines as _tool_lines
from kafka_local_parts.cli import env_line, main
from kafka_local_parts.cli_parser import build_parser
from kafka_local_parts.cluster import Cluster, restart_node, start_node
from kafka_local_parts.cluster_start import restart_cluster, start_cluster
from kafka_local_parts.constants import (
    ADMIN_USER,
    APP_USER,
    AUTHORIZER,
    BROKER_PRINCIPAL,
    BROKER_SETTINGS,
    CERT_DAYS,
    CLUSTER_JVM_OPTS,
    CLUSTERFILE,
    DATA,
    DEFAULT_CLUSTER_START_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    DEPENDENCY_PLUGIN,
    HOST,
    INFOFILE,
    JVM_OPTS,
    KAFKA_VERSION,
    LOGFILE,
    MAX_NODES,
    NODE_ID,
    PIDFILE,
    PRINCIPAL_RULES,
    SASL_MECHANISM,
    SCALA_VERSION,
    SCRAM_MECHANISMS,
    SECRETS,
    SECURITY_PROTOCOLS,
    TLS,
    USERS,
    BrokerError,
    cache_root,
    default_state_dir,
    kafka_version,
)
from kafka_local_parts.credentials import (
    Credentials,
    client_auth,
    client_settings,
    ensure_credentials,
    env_lines,
    listener_name,
    password_file,
    read_credentials,
    read_password,
)
from kafka_local_parts.jars import _pom as _pom
from kafka_local_parts.jars import ensure_jars
from kafka_local_parts.jvm import _cluster_id as _cluster_id
from kafka_local_parts.jvm import _format_command as _format_command
from kafka_local_parts.jvm import _logging_config as _logging_config
from kafka_local_parts.jvm import scram_arguments
from kafka_local_parts.oidc import (
    TokenServer,
    allowed_urls_option,
    oauth_client_settings,
    oauth_properties,
    read_token_server,
    start_token_server,
)
from kafka_local_parts.ports import (
    StartPlan,
    choose_cluster_ports,
    choose_ports,
    free_port,
    plan_start,
    port_free,
)
from kafka_local_parts.processes import (
    STRAGGLER_GRACE,
    kill,
    kill_node,
    stop,
    stop_node,
    stop_token_server,
)
from kafka_local_parts.properties import _write_properties as _write_properties
from kafka_local_parts.properties import (
    cluster_properties,
    security_properties,
    server_properties,
)
from kafka_local_parts.state_dir import (
    Remembered,
    formatted_cluster_id,
    log_tail,
    node_dir,
    read_remembered,
    write_remembered,
)
from kafka_local_parts.state_dir import _cluster_formatted as _cluster_formatted
from kafka_local_parts.status import NodeStatus, Status, cluster_status, is_cluster, status
from kafka_local_parts.tls import TlsFiles, make_tls, tls_files
from kafka_local_parts.wire import (
    AuthenticationFailed,
    ClientAuth,
    ScramClient,
    broker_ids,
    probe,
    wait_until_ready,
)

__all__ = [
    "ACL_COMMAND",
    "ADMIN_PROPERTIES",
    "ADMIN_USER",
    "APP_USER",
    "AUTHORIZER",
    "BIN",
    "BROKER_PRINCIPAL",
    "BROKER_SETTINGS",
    "CERT_DAYS",
    "CLUSTERFILE",
    "CLUSTER_JVM_OPTS",
    "CLUSTER_RESOURCE",
    "DATA",
    "DEFAULT_CLUSTER_START_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "DEPENDENCY_PLUGIN",
    "HOST",
    "INFOFILE",
    "JVM_OPTS",
    "KAFKA_VERSION",
    "LOGFILE",
    "MAX_NODES",
    "NODE_ID",
    "OPERATIONS",
    "PATTERNS",
    "PIDFILE",
    "PRINCIPAL_RULES",
    "RESOURCE_TYPES",
    "SASL_MECHANISM",
    "SCALA_VERSION",
    "SCRAM_MECHANISMS",
    "SECRETS",
    "SECURITY_PROTOCOLS",
    "STRAGGLER_GRACE",
    "TLS",
    "USERS",
    "Acl",
    "AuthenticationFailed",
    "Broker",
    "BrokerError",
    "ClientAuth",
    "Cluster",
    "Credentials",
    "NodeStatus",
    "Remembered",
    "ScramClient",
    "StartPlan",
    "Status",
    "TlsFiles",
    "TokenServer",
    "admin_properties",
    "allowed_urls_option",
    "broker_ids",
    "build_parser",
    "cache_root",
    "check_restartable",
    "choose_cluster_ports",
    "choose_ports",
    "client_auth",
    "client_settings",
    "cluster_properties",
    "cluster_status",
    "create_acls",
    "default_state_dir",
    "describe_acls",
    "encode_create_acls",
    "ensure_credentials",
    "ensure_jars",
    "env_line",
    "env_lines",
    "formatted_cluster_id",
    "free_port",
    "grant",
    "is_cluster",
    "kafka_version",
    "kill",
    "kill_node",
    "listener_name",
    "log_tail",
    "main",
    "make_tls",
    "node_dir",
    "oauth_client_settings",
    "oauth_properties",
    "parse_describe_acls",
    "password_file",
    "plan_start",
    "port_free",
    "probe",
    "read_credentials",
    "read_password",
    "read_remembered",
    "read_token_server",
    "resolve_security",
    "restart",
    "restart_cluster",
    "restart_node",
    "scram_arguments",
    "security_properties",
    "server_properties",
    "start",
    "start_cluster",
    "start_node",
    "start_token_server",
    "status",
    "stop",
    "stop_node",
    "stop_token_server",
    "tls_files",
    "tool_env_lines",
    "wait_until_ready",
    "write_admin_tools",
    "write_remembered",
]

if __name__ == "__main__":
    sys.exit(main())
