"""The code of ``scripts/kafka_local.py`` (a local Apache Kafka without Docker), by concept.

``scripts/kafka_local.py`` is the entry point and the facade: it re-exports the public
names of these modules (and the private ones the tests use). Stdlib only. The modules,
each importing only the ones above it (its docstring says which), save one call back up
(``Broker.restart`` of a cluster's node, at call time):

- constants: pinned versions, settings, file names, BrokerError, the paths;
- jars: Kafka's jars from Maven Central, cached;
- state_dir: a state dir's files (pid, info, log, cluster.json, node dirs, lock);
- processes: pids, signals, stopping and killing a dir's broker(s) or one node;
- wire: Kafka's wire protocol for the readiness probe, TLS and SCRAM;
- tls, credentials: certificates, passwords, what a client needs (``KAFKA_*``);
- oidc (and oidc_server, run as a process): a SASL_SSL broker's token server, OAUTHBEARER;
- properties: ``server.properties``;
- jvm: ``java``, log4j config, the broker JVM, ``kafka-storage format``;
- ports: free ports, the plan of a start, the ports of a broker or a cluster;
- broker: a single broker (:class:`Broker`, start, restart);
- cluster, cluster_start: a multi-node cluster, its nodes, its start;
- status, acls, admin_tools: status, ``grant``, ``kafka-acls.sh``;
- cli_parser, cli: the ``kafka-local`` command line.
"""
