"""A node on a secured broker (issue 18, item 2): SASL_SSL (TLS, SCRAM-SHA-512) with ACLs
enforced, as a user that has exactly the ACLs `NODE_ACLS` lists: granted by the README's
`kafka-acls.sh` commands, run as written (and found to grant just those).

The session's SASL_SSL broker (``kafka_secured``, tests/conftest.py): its super user
``admin`` is the test's own clients (they schedule timers and read what the node wrote);
the node and the operator's command run as ``tickwheel``, which has no ACL but those a test
grants it, on that test's context and group only. The node creates its topics itself.
Then: one ACL taken away, the node says what was refused and stops (exit 1); a wrong
password, an untrusted CA, one clear error at once; no Create ACL, the topics named at once.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import kafka_broker  # registered by tests/conftest.py
import orjson
import pytest
from harness import Client, Cluster, Worker, connection_of, eventually

from app.protocol.wire import ResultCode
from tables import ACTIVE, TimerStatus

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_secured]

NODE_ACLS: Final[tuple[tuple[str, str, str, tuple[str, ...]], ...]] = (
    # (resource type, name, pattern type, operations): what a node of the bounded context
    # `{context}` in the consumer group `{group}` (TICKWHEEL_GROUP_ID) needs, no more.
    # Its topics, all named `<context>.…`: created at start, read and written (Describe
    # comes with Read and Write); their max.message.bytes, read at start (the partitions'
    # transaction batches, the dead letters' cut; without it: a warning, 1 MiB assumed).
    ("topic", "{context}.", "prefixed", ("read", "write", "create", "describe_configs")),
    # The group: joining it, committing its offsets (Describe comes with Read).
    ("group", "{group}", "literal", ("read",)),
    # One transactional producer per partition and type, `<group>.<context>.<aggregate>.
    # timers.<partition>` (Describe comes with Write).
    ("transactional_id", "{group}.", "prefixed", ("write",)),
    # No IdempotentWrite on the cluster: since Kafka 3.0 Write on a topic allows the
    # idempotent producer (a broker before 3.0 needs ("cluster", "kafka-cluster",
    # "literal", ("idempotent_write",)) too).
)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PARTITIONS = 4
OPTIONS = '{"claim_timeout": 5000, "send_timeout": 4000}'
USER = "tickwheel"
STOP_BOUND_S = 60.0  # a node or a command refused: it says so and exits within this


def secured_cluster(broker: kafka_broker.SecuredKafka, base: Path, **variables: str) -> Cluster:
    """Workers and commands as `USER` over SASL_SSL; the test's clients as ``admin``."""
    return Cluster(
        broker.bootstrap,
        base,
        partitions=PARTITIONS,
        env={**broker.env(USER), "TICKWHEEL_TIMER_OPTIONS": OPTIONS, **variables},
        kafka=connection_of(broker.env("admin")),
    )


def acls_for(
    cluster: Cluster, acls: Iterable[tuple[str, str, str, tuple[str, ...]]]
) -> list[tuple[str, str, str, tuple[str, ...]]]:
    return [
        (kind, name.format(context=cluster.context, group=cluster.group), pattern, ops)
        for kind, name, pattern, ops in acls
    ]


async def grant(
    broker: kafka_broker.SecuredKafka,
    cluster: Cluster,
    acls: Iterable[tuple[str, str, str, tuple[str, ...]]],
) -> None:
    for kind, name, pattern, ops in acls_for(cluster, acls):
        await asyncio.to_thread(broker.grant, kind, name, list(ops), user=USER, pattern=pattern)


def readme_acl_commands() -> str:
    """The README's one sh block of `kafka-acls.sh` commands."""
    blocks: list[str] = [
        b for b in re.findall(r"```sh\n(.*?)```", README, re.S) if "kafka-acls.sh" in b
    ]
    assert len(blocks) == 1, "the README shows one block of kafka-acls.sh commands"
    return blocks[0]


def readme_env_line() -> str:
    """The README's line that sets a shell's variables for the local secured broker."""
    lines: list[str] = re.findall(r'`(eval "\$\(scripts/kafka-local env [^`]*)`', README)
    assert lines == [f'eval "$(scripts/kafka-local env --user {USER})"'], lines
    return lines[0]


async def grant_as_the_readme_says(broker: kafka_broker.SecuredKafka, cluster: Cluster) -> None:
    """Runs the README's `eval "$(scripts/kafka-local env --user tickwheel)"` and its
    `kafka-acls.sh` commands as written (bash, with `CTX` and `GROUP` the test's, and
    `TICKWHEEL_STATE`, the script's default state dir, the session broker's); returns once
    the broker applies exactly the ACLs `NODE_ACLS` lists."""
    command = readme_env_line() + "\n" + readme_acl_commands()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    variables = {"CTX": cluster.context, "GROUP": cluster.group}
    variables["TICKWHEEL_STATE"] = str(broker.state_dir)
    run = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        command,
        cwd=ROOT,
        env={**clean, **variables},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(run.communicate(), 120)
    assert run.returncode == 0, (out.decode(errors="replace"), err.decode(errors="replace"))
    script = kafka_broker.load_kafka_local()
    principal = f"User:{USER}"
    wanted = {
        script.Acl(principal, kind, name, op, pattern)
        for kind, name, pattern, ops in acls_for(cluster, NODE_ACLS)
        for op in ops
    }
    auth = broker.broker.client_auth("admin")

    def mine(acl: object) -> bool:
        name = getattr(acl, "name", "")
        return getattr(acl, "principal", "") == principal and (
            name.startswith((cluster.context, cluster.group))
        )

    async def applied() -> bool:
        found = await asyncio.to_thread(script.describe_acls, broker.bootstrap, auth)
        return {a for a in found if mine(a)} == wanted

    await eventually(applied, 30, "the README's ACLs applied, no more, no fewer", interval=0.2)


def refused(text: str) -> bool:
    """Whether `text` says that something was not authorized."""
    return "not authorized" in text.lower() or "authorization" in text.lower()


def runs_all(worker: Worker) -> bool:
    """Ready, and running every partition (or failed: its log says why)."""
    if not worker.alive:
        raise AssertionError(f"{worker.name} exited {worker.proc.returncode}:\n{worker.text()}")
    health = worker.health()
    return bool(health and health["ready"] and len(health["owned"]) == PARTITIONS)


async def test_a_node_runs_as_a_user_with_only_the_acls_listed(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    cluster = secured_cluster(broker, tmp_path)
    await grant_as_the_readme_says(broker, cluster)
    began = time.monotonic()
    try:
        worker = cluster.start_worker()
        await eventually(lambda: runs_all(worker), 90, "the node runs every partition")
        started_s = time.monotonic() - began
        async with Client(cluster) as client:  # the topics are there: the node made them
            now = int(time.time() * 1000)
            due = {
                (f"o{o}", f"k{k}"): now + 2_500 + 100 * (o * 10 + k)
                for o in range(3)
                for k in range(10)
            }
            schedule = [
                client.command(
                    owner,
                    "ScheduleMany",
                    {
                        "timers": [
                            {"key": key, "rule": {"kind": "once", "at": at}}
                            for (o, key), at in due.items()
                            if o == owner
                        ]
                    },
                    request_id=f"plan-{owner}",
                )
                for owner in ("o0", "o1", "o2")
            ]
            await client.send(*schedule)
            results = await client.wait_results([c.request_id for c in schedule])
            assert {r.code for r in results.values()} == {ResultCode.COMMITTED}, results
            # Two of each owner's cancelled well before they are due.
            cancelled_keys = {("o0", "k8"), ("o0", "k9"), ("o1", "k8"), ("o1", "k9")}
            cancel = [
                client.command(owner, "Unschedule", {"keys": ["k8", "k9"]})
                for owner in ("o0", "o1")
            ]
            await client.send(*cancel)
            results = await client.wait_results([c.request_id for c in cancel])
            assert {r.code for r in results.values()} == {ResultCode.COMMITTED}, results

            async def settled() -> bool:
                rows = (await client.timers()).values()
                return len(rows) == len(due) and all(t.status not in ACTIVE for t in rows)

            await eventually(settled, 60, "every timer fired or cancelled", interval=0.5)
            rows = await client.timers()
            fired = Counter(e.request_id for e in await client.events() if e.type == "Fired")
            health = worker.health()
        by_key = {(t.owner.id, t.key): t for t in rows.values()}
        assert set(by_key) == set(due)
        for key, timer in by_key.items():
            want = TimerStatus.CANCELLED if key in cancelled_keys else TimerStatus.FIRED
            assert timer.status == want, (key, timer)
        assert fired == {f"{t.id}#0": 1 for k, t in by_key.items() if k not in cancelled_keys}, (
            "each timer applied once, none cancelled"
        )
        assert health is not None and health["ready"], health

        # The operator's command, as the same user.
        code, out, err, took = await cluster.run_cli(
            ["timers", "list", "--type", f"{cluster.context}.counter", "--json"]
        )
        assert code == 0, err
        listed = {row["id"]: row["status"] for row in map(orjson.loads, out.splitlines())}
        assert listed == {t.id: t.status.value for t in rows.values()}
        print(
            f"\nSASL_SSL as {USER!r}: the node ran every partition {started_s:.1f} s after "
            f"its start, {len(fired)} timers fired once, 4 cancelled; timers list: {took:.1f} s"
        )
    finally:
        await asyncio.to_thread(cluster.stop_all)


async def test_a_node_without_its_transactional_id_acl_stops_and_says_so(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    cluster = secured_cluster(broker, tmp_path)
    taken_away = ("transactional_id", "{group}.", "prefixed", ("write",))
    assert taken_away in NODE_ACLS
    await grant(broker, cluster, [a for a in NODE_ACLS if a != taken_away])
    samples: list[dict[str, Any]] = []
    began = time.monotonic()
    worker = cluster.start_worker()
    try:

        def exited() -> bool:
            if (health := worker.health()) is not None:
                samples.append(health)
            return not worker.alive

        await eventually(exited, 150, "the node stopped", interval=0.5)
        took = time.monotonic() - began
    finally:
        await asyncio.to_thread(cluster.stop_all)
    lines = worker.text().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    named = f"{cluster.group}.{cluster.context}.counter.timers."  # the transactional ids
    refusals = [line for line in lines if named in line and refused(line)]
    # Idle before the group gives it partitions (ready: nothing to serve); then restoring.
    given = next((i for i, s in enumerate(samples) if s["restoring"] or s["owned"]), None)
    print(
        f"\nwithout {taken_away}: exit {worker.proc.returncode} after {took:.1f} s; "
        f"{len(lines)} log lines, {len(refusals)} of them refusals; its error: {errors}; "
        f"the first refusal: {refusals[:1]}; /healthz sampled {len(samples)} times, ready "
        f"{sum(s['ready'] for s in samples[given or 0 :])} times once given partitions"
    )
    assert worker.proc.returncode not in (0, None)
    assert len(errors) == 1, errors
    # What was refused is named: the transactional ids, and that it is an authorization.
    assert refusals, lines
    assert "not authorized on a transactional id" in errors[0], errors
    # Never ready once given partitions: a node that cannot take them serves nothing. (A
    # refusal stops the node at once, so /healthz may never be sampled after the group
    # gave it partitions: then no sample is ready after that either.)
    if given is not None:
        assert not any(s["ready"] for s in samples[given:]), samples


async def test_a_node_without_the_create_acl_stops_at_once_naming_the_topic(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    cluster = secured_cluster(broker, tmp_path)
    topics = ("topic", "{context}.", "prefixed", ("read", "write", "create", "describe_configs"))
    assert topics in NODE_ACLS
    without_create = ("topic", "{context}.", "prefixed", ("read", "write", "describe_configs"))
    await grant(broker, cluster, [without_create if a == topics else a for a in NODE_ACLS])
    began = time.monotonic()
    worker = cluster.start_worker()
    try:
        await eventually(lambda: not worker.alive, STOP_BOUND_S, "the node stopped")
        took = time.monotonic() - began
    finally:
        await asyncio.to_thread(cluster.stop_all)
    lines = worker.text().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    print(
        f"\nwithout Create on the topics: exit {worker.proc.returncode} after {took:.1f} s: "
        f"{errors}"
    )
    assert worker.proc.returncode == 1
    assert len(errors) == 1, lines
    assert f"not authorized to create topic {cluster.context}." in errors[0], errors
    assert f"'{cluster.context}.' prefixed: Create" in errors[0], errors
    assert "or on the cluster" in errors[0] and broker.bootstrap in errors[0], errors
    assert took < 20, took  # not the clients' metadata wait (40 s) for topics never made


async def test_a_node_without_the_create_acl_runs_on_topics_made_beforehand(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    cluster = secured_cluster(broker, tmp_path)
    topics = ("topic", "{context}.", "prefixed", ("read", "write", "create", "describe_configs"))
    without_create = ("topic", "{context}.", "prefixed", ("read", "write", "describe_configs"))
    await grant(broker, cluster, [without_create if a == topics else a for a in NODE_ACLS])
    try:
        async with Client(cluster):  # the administrator creates the topics
            pass
        worker = cluster.start_worker()
        # The broker refuses Create on these topics too: they exist, so the node goes on.
        await eventually(lambda: runs_all(worker), 90, "the node runs every partition")
    finally:
        await asyncio.to_thread(cluster.stop_all)


async def _refused_at_once(
    broker: kafka_broker.SecuredKafka, cluster: Cluster
) -> tuple[Worker, list[str], int, str, str]:
    """A node and a command as a client the broker refuses: the node's log lines, the
    command's exit code, stdout and stderr; each within STOP_BOUND_S."""
    await grant(broker, cluster, NODE_ACLS)  # authorized, were it let in
    began = time.monotonic()
    worker = cluster.start_worker()
    try:
        await eventually(lambda: not worker.alive, STOP_BOUND_S, "the node stopped")
        worker_s = time.monotonic() - began
    finally:
        await asyncio.to_thread(cluster.stop_all)
    lines = worker.text().splitlines()
    code, out, err, command_s = await cluster.run_cli(
        ["timers", "list", "--type", f"{cluster.context}.counter"], within=STOP_BOUND_S
    )
    print(
        f"\nthe node exited {worker.proc.returncode} after {worker_s:.1f} s, log {lines}; "
        f"timers list exited {code} after {command_s:.1f} s: {err.strip()!r}"
    )
    assert command_s < STOP_BOUND_S
    return worker, lines, code, out, err


def one_error(text: str, bootstrap: str, mechanism: str, cause: str) -> None:
    """`text` is one error line naming the broker's address, how the client connects
    (`mechanism`) and the `cause`, not the client library's retries."""
    assert text.startswith("error:"), text
    assert bootstrap in text and mechanism in text and cause in text, text
    assert "Unable to bootstrap" not in text, text


async def test_a_wrong_password_is_one_clear_error_at_once(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    cluster = secured_cluster(broker, tmp_path, KAFKA_SASL_PASSWORD_FILE=str(wrong))
    worker, lines, code, out, err = await _refused_at_once(broker, cluster)
    assert worker.proc.returncode == 1
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, lines
    assert len(lines) <= 5, lines  # not a retry flood
    how = f"SASL_SSL SCRAM-SHA-512 as '{USER}'"
    one_error(errors[0], broker.bootstrap, how, "authentication failed")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    one_error(err.strip(), broker.bootstrap, how, "authentication failed")
    assert "KAFKA_SASL_PASSWORD" in err


async def test_a_broker_certificate_of_an_unknown_ca_is_one_clear_error_at_once(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    # No KAFKA_SSL_CAFILE: the system's CAs, which did not sign the local broker's.
    cluster = secured_cluster(broker, tmp_path)
    cluster.env.pop("KAFKA_SSL_CAFILE")
    worker, lines, code, out, err = await _refused_at_once(broker, cluster)
    assert worker.proc.returncode == 1
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and len(lines) <= 5, lines
    how = f"SASL_SSL SCRAM-SHA-512 as '{USER}'"
    one_error(errors[0], broker.bootstrap, how, "certificate is not trusted")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    one_error(err.strip(), broker.bootstrap, how, "KAFKA_SSL_CAFILE")


async def test_a_missing_key_file_is_a_configuration_error(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    gone = str(tmp_path / "client.key")
    cluster = secured_cluster(
        broker, tmp_path, KAFKA_SSL_CERTFILE=str(tmp_path / "client.pem"), KAFKA_SSL_KEYFILE=gone
    )
    (tmp_path / "client.pem").write_text("unused: the key file is missing\n")
    code, out, err, _ = await cluster.run_cli(
        ["timers", "list", "--type", f"{cluster.context}.counter"], within=STOP_BOUND_S
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    one_error(err.strip(), broker.bootstrap, "SASL_SSL SCRAM-SHA-512", "KAFKA_SSL_KEYFILE")
    assert gone in err
