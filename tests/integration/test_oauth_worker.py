"""A node on a broker that takes OIDC tokens (SASL_SSL with OAUTHBEARER, KIP-768): the
session's SASL_SSL broker (``kafka_secured``) checks tokens with Kafka's
`OAuthBearerValidatorCallbackHandler` against the JWKS of the token server it was started
with (scripts/kafka_local_parts/oidc.py). The node and the operator's command log in as
``tickwheel`` with the client-credentials grant (the token's ``sub``: the principal
``User:tickwheel``, which has only the ACLs a test grants it); the test's own clients are
the SCRAM super user. A timer fires end to end; a wrong client secret is one clear error
at start naming the token endpoint and the OAuth error.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import kafka_broker  # registered by tests/conftest.py
import orjson
import pytest
from harness import Client, Cluster, connection_of, eventually
from test_secured_worker import NODE_ACLS, OPTIONS, PARTITIONS, STOP_BOUND_S, USER, grant, runs_all

from app.protocol.wire import ResultCode
from tables import TimerStatus

pytestmark = [pytest.mark.kafka, pytest.mark.kafka_secured]


def oauth_cluster(broker: kafka_broker.SecuredKafka, base: Path, **variables: str) -> Cluster:
    """Workers and commands as `USER` with OAUTHBEARER; the test's clients as ``admin``."""
    return Cluster(
        broker.bootstrap,
        base,
        partitions=PARTITIONS,
        env={**broker.oauth_env(USER), "TICKWHEEL_TIMER_OPTIONS": OPTIONS, **variables},
        kafka=connection_of(broker.env("admin")),
    )


async def test_a_node_logged_in_with_an_oidc_token_fires_a_timer(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    cluster = oauth_cluster(broker, tmp_path)
    await grant(broker, cluster, NODE_ACLS)
    began = time.monotonic()
    try:
        worker = cluster.start_worker()
        await eventually(lambda: runs_all(worker), 90, "the node runs every partition")
        started_s = time.monotonic() - began
        async with Client(cluster) as client:
            due = int(time.time() * 1000) + 2_000
            schedule = client.command(
                "o1",
                "ScheduleMany",
                {"timers": [{"key": "k1", "rule": {"kind": "once", "at": due}}]},
                request_id="oauth-plan",
            )
            await client.send(schedule)
            results = await client.wait_results([schedule.request_id])
            assert {r.code for r in results.values()} == {ResultCode.COMMITTED}, results

            async def fired() -> bool:
                rows = (await client.timers()).values()
                return [t.status for t in rows] == [TimerStatus.FIRED]

            await eventually(fired, 60, "the timer fired", interval=0.5)
            [timer] = (await client.timers()).values()
            events = [e for e in await client.events() if e.type == "Fired"]
        assert [e.request_id for e in events] == [f"{timer.id}#0"]
        # The operator's command, as the same OAUTHBEARER client.
        code, out, err, took = await cluster.run_cli(
            ["timers", "list", "--type", f"{cluster.context}.counter", "--json"]
        )
        assert code == 0, err
        listed = {row["id"]: row["status"] for row in map(orjson.loads, out.splitlines())}
        assert listed == {timer.id: TimerStatus.FIRED.value}
        print(
            f"\nOAUTHBEARER as {USER!r}: every partition {started_s:.1f} s after the start; "
            f"the timer fired once; timers list {took:.1f} s"
        )
    finally:
        await asyncio.to_thread(cluster.stop_all)


async def test_a_wrong_client_secret_is_one_clear_error_at_start(
    kafka_secured: kafka_broker.SecuredKafka, tmp_path: Path
) -> None:
    broker = kafka_secured
    wrong = tmp_path / "wrong.secret"
    wrong.write_text("not-the-secret\n")
    cluster = oauth_cluster(broker, tmp_path, KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE=str(wrong))
    endpoint = cluster.env["KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"]
    worker = cluster.start_worker()
    try:
        await eventually(lambda: not worker.alive, STOP_BOUND_S, "the node stopped")
    finally:
        await asyncio.to_thread(cluster.stop_all)
    errors = [line for line in worker.text().splitlines() if line.startswith("error:")]
    print(f"\na wrong client secret: exit {worker.proc.returncode}: {errors}")
    assert worker.proc.returncode == 1
    assert len(errors) == 1, worker.text()
    assert endpoint in errors[0] and "invalid_client" in errors[0], errors
    assert "OAUTHBEARER as client 'tickwheel'" in errors[0], errors
    assert "not-the-secret" not in worker.text()
