"""The command line's parser: ``kafka-local``'s commands and options, its description and
examples (``--help``). May import: acls, constants.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .acls import OPERATIONS
from .constants import (
    ADMIN_USER,
    APP_USER,
    DEFAULT_CLUSTER_START_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    KAFKA_VERSION,
    SECURITY_PROTOCOLS,
    USERS,
)

_DESCRIPTION = """\
Run a local Apache Kafka (KRaft) from Apache Kafka's own jars, without Docker: one node,
or a cluster of several (--brokers 3); PLAINTEXT, or secured (--security ssl|sasl_ssl:
TLS, SCRAM users and ACLs).  It keeps its data in the state dir between starts, like a
real one: `start` again serves the same topics, records and committed offsets on the same
address; `start --fresh` wipes them for an empty broker."""

_EPILOG = """\
examples:
  kafka-local start                      # start (or keep running); last stdout line: address
  eval "$(kafka-local env)"              # export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT
  kafka-local restart                    # stop + start: same data, same address
  kafka-local start --fresh              # an empty broker (wipes the data)
  kafka-local stop                       # stop; the data stays for the next start

  kafka-local start --fresh --security sasl_ssl   # SCRAM-SHA-512 over TLS, ACLs enforced
  eval "$(kafka-local env)"              # + KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*, KAFKA_SSL_*
  eval "$(kafka-local env --user tickwheel)"      # the user without ACLs
  kafka-local grant --topic orders --operation read --operation describe

  kafka-local start --fresh --brokers 3  # three nodes (3 JVMs); address: all three
  kafka-local kill --node 2              # SIGKILL one node; `start --node 2` brings it back
  kafka-local status                     # one line per node

exit codes: 0 ok, 1 error (or broker unresponsive, or a node down), 3 not running."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-local",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="state dir: settings, data/, broker.log, tls/, secrets/ "
        "(default ${TICKWHEEL_STATE:-/tmp/tickwheel-kafka})",
    )
    node = argparse.ArgumentParser(add_help=False)
    node.add_argument(
        "--node",
        type=int,
        default=None,
        metavar="N",
        help="only node N (1, 2, ...) of a cluster (--brokers); a single broker is node 1",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start_cmd = commands.add_parser(
        "start",
        parents=[common, node],
        help="start the broker, keeping its data and address (--fresh: empty), and wait",
        description="Start the broker and wait until it answers; print its address "
        "(127.0.0.1:PORT, every node's for a cluster) as the last line on stdout.  A state "
        "dir that held a broker before keeps its data, cluster id, port, --brokers and "
        "--security (an error if that port is taken by something else); a broker already "
        "running there is left alone (a cluster's stopped nodes are started).  --node N "
        "starts one node of a cluster again.",
    )
    start_cmd.add_argument(
        "--fresh",
        action="store_true",
        help="wipe the data and format anew: an empty broker with a new cluster id "
        "(stops a running one first); it keeps the remembered port if that is free, "
        "and the certificates and passwords",
    )
    start_cmd.add_argument(
        "--port",
        type=int,
        default=None,
        help="client port (node N of a cluster: PORT+N-1; default: the one remembered in "
        "the state dir, else a free one); remembered for later starts",
    )
    start_cmd.add_argument(
        "--security",
        choices=SECURITY_PROTOCOLS,
        default=None,
        help="plaintext; ssl (TLS, client certificates required); sasl_ssl (SCRAM-SHA-512 "
        "and -256 over TLS); ssl and sasl_ssl enforce ACLs (super user admin, user "
        "tickwheel with none).  Default: the remembered one, at first plaintext",
    )
    start_cmd.add_argument(
        "--brokers",
        type=int,
        default=None,
        metavar="N",
        help="nodes (each broker and controller, its own JVM with a 256 MiB heap; with 3, "
        "replication factor 3 and min.insync.replicas=2).  Default: the remembered "
        "count, at first 1",
    )
    start_cmd.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for it (default {DEFAULT_START_TIMEOUT:g}, "
        f"{DEFAULT_CLUSTER_START_TIMEOUT:g} for a cluster)",
    )
    start_cmd.add_argument("--kafka-version", default=None, help=f"default {KAFKA_VERSION}")
    start_cmd.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting for this start (and its restarts; every node); repeatable",
    )
    restart_cmd = commands.add_parser(
        "restart",
        parents=[common, node],
        help="stop and start again: same data, same address",
        description="Stop the broker (if it runs) and start it again on the same state dir "
        "and port, keeping its data, Kafka version, security and --set settings; print its "
        "address as the last line on stdout.  For trying recovery after a broker outage.  "
        "--node N: only that node of a cluster.",
    )
    restart_cmd.add_argument("--timeout", type=float, default=None, help="seconds to wait for it")
    stop_cmd = commands.add_parser(
        "stop",
        parents=[common, node],
        help="stop the broker (its data stays for the next start)",
        description="SIGTERM the broker (every node of a cluster at once, or --node N), "
        "SIGKILL after --timeout seconds.  The data stays in the state dir for the next start.",
    )
    stop_cmd.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT)
    commands.add_parser(
        "kill",
        parents=[common, node],
        help="SIGKILL the broker or one node (a crash; the data stays)",
        description="SIGKILL the broker's process group (every node, or --node N): no "
        "clean shutdown, as a crash.  The data stays; `start` (--node N) brings it back.",
    )
    commands.add_parser(
        "status",
        parents=[common],
        help="running/stopped and the address (each node of a cluster)",
        description="Print `running 127.0.0.1:PORT ...` (exit 0), `unresponsive ...` "
        "(exit 1) or `stopped` (exit 3); for a cluster a summary line (`running`, "
        "`degraded` when a node is down, exit 1) and a line per node.",
    )
    env_cmd = commands.add_parser(
        "env",
        parents=[common],
        help="print the `export KAFKA_...=...` lines for eval",
        description="Print `export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT` for the running "
        'broker, for `eval "$(scripts/kafka-local env)"`; for a secured one also '
        "KAFKA_SECURITY_PROTOCOL, KAFKA_SSL_CAFILE and KAFKA_SSL_CERTFILE/KAFKA_SSL_KEYFILE "
        "(ssl) or KAFKA_SASL_MECHANISM/KAFKA_SASL_USERNAME/KAFKA_SASL_PASSWORD_FILE "
        "(sasl_ssl), with PATH leading to Kafka's kafka-acls.sh (written in DIR/bin) and "
        "KAFKA_ADMIN_PROPERTIES, the super user's --command-config.  Exit 3 (nothing on "
        "stdout) if it is stopped.",
    )
    env_cmd.add_argument(
        "--user",
        choices=USERS,
        default=ADMIN_USER,
        help=f"a secured broker's user (default {ADMIN_USER}, the super user; "
        f"{APP_USER} has only the ACLs granted to it)",
    )
    env_cmd.add_argument(
        "--oauth",
        action="store_true",
        help="a sasl_ssl broker's: log in with OAUTHBEARER (KAFKA_SASL_OAUTHBEARER_*: the "
        "broker's token server, the user as client id, its password as the secret)",
    )
    grant_cmd = commands.add_parser(
        "grant",
        parents=[common],
        help="allow a user operations on a topic, group, transactional id or the cluster",
        description="Create ALLOW ACLs on a secured broker (as the super user) and wait "
        "until every node applies them.",
    )
    grant_cmd.add_argument("--user", default=APP_USER, help=f"default {APP_USER}")
    resource = grant_cmd.add_mutually_exclusive_group(required=True)
    resource.add_argument("--topic", metavar="NAME")
    resource.add_argument("--group", metavar="NAME")
    resource.add_argument("--transactional-id", metavar="NAME")
    resource.add_argument("--cluster", action="store_true")
    grant_cmd.add_argument(
        "--prefixed", action="store_true", help="NAME is a prefix (default: the exact name)"
    )
    grant_cmd.add_argument(
        "--operation",
        action="append",
        required=True,
        type=lambda text: text.lower().replace("-", "_"),
        choices=sorted(OPERATIONS),
        help="repeatable",
    )
    fetch_cmd = commands.add_parser("fetch", help="only resolve the jars; print their folder")
    fetch_cmd.add_argument("--kafka-version", default=None, help=f"default {KAFKA_VERSION}")
    return parser
