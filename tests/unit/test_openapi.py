"""The OpenAPI document (`app.ops.openapi`) says what the routes answer: `/timers/upcoming`'s
whole answer, and the 503s (with `Retry-After`) that reads answer when another read holds
the node's turn, the broker is away or a partition's store failed. (That it describes every
JSON route the server registers: tests/unit/test_timer_api.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from fakes import PAGE_PARTITIONS, FakeNode, ref
from yarl import URL

from app.ops.openapi import openapi_document
from app.ops.timer_routes import TIMER_PATH
from app.ops.upcoming import UpcomingAnswer, UpcomingPage
from app.ops.web import WebServer
from tables import CommandSpec, OnceRule, StoreError, Timer, TimerStatus
from tables.partitioner import partition_of

DOC = openapi_document("0")
SCHEMAS: dict[str, Any] = DOC["components"]["schemas"]


def _schema_of(response: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return schema


def _model_named(ref: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = SCHEMAS[ref["$ref"].rsplit("/", 1)[1]]
    return schema


@pytest.fixture
async def web() -> AsyncIterator[tuple[FakeNode, URL, aiohttp.ClientSession]]:
    node = FakeNode()
    server = WebServer(node, 0)  # type: ignore[arg-type]
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield node, URL(f"http://127.0.0.1:{server.port}"), http
    finally:
        await server.stop()


def _timer(owner: str, key: str, due: int) -> Timer:
    return Timer(
        id=f"{owner}/{key}",
        owner=ref(owner),
        key=key,
        version=1,
        partition=partition_of(owner, PAGE_PARTITIONS),
        status=TimerStatus.PENDING,
        rule=OnceRule(at=due),
        target=ref(owner),
        command=CommandSpec(type="Remind"),
        slot_due_at=due,
        due_at=due,
    )


async def test_the_upcoming_answer_is_described_whole(
    web: tuple[FakeNode, URL, aiohttp.ClientSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The document described the CLI's page (`timers`, `next_cursor`) alone: the route
    answers `partitions`, `scanned_all` and `unread` too."""
    node, url, http = web
    node.owned = list(range(PAGE_PARTITIONS))
    for n, owner in enumerate(("o1", "o2", "o3")):
        t = _timer(owner, "k", 1_000 + n)
        assert await node.store.put(t)
    due_after = node.store.due_after
    failing = partition_of("o1", PAGE_PARTITIONS)

    async def damaged(partitions: set[int], *args: Any) -> list[Timer]:
        if partitions == {failing}:
            raise StoreError(f"partition {failing} failed", partition=failing)
        return await due_after(partitions, *args)

    monkeypatch.setattr(node.store, "due_after", damaged)
    async with http.get(url.with_path("/timers/upcoming")) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    described = _model_named(
        _schema_of(DOC["paths"]["/timers/upcoming"]["get"]["responses"]["200"])
    )
    assert set(described["properties"]) == set(answer)
    assert set(described["required"]) == set(answer)
    assert answer["unread"] and answer["scanned_all"] is False
    UpcomingAnswer.model_validate(answer)
    # The command's page, printed by `timers upcoming --json`, keeps its two fields.
    assert set(UpcomingPage.model_fields) == {"timers", "next_cursor"}


@pytest.mark.parametrize(
    ("path", "method"),
    [("/jobs", "get"), ("/timers/upcoming", "get"), (TIMER_PATH, "get")],
)
def test_the_reads_that_answer_503_say_so_with_retry_after(path: str, method: str) -> None:
    responses = DOC["paths"][path][method]["responses"]
    assert "503" in responses, (method, path)
    assert "Retry-After" in responses["503"]["headers"], (method, path)


def test_every_503_but_a_health_checks_carries_retry_after() -> None:
    health = {"/livez", "/readyz", "/healthz"}
    for path, item in DOC["paths"].items():
        for method, op in item.items():
            if method == "parameters" or path in health:
                continue
            unavailable = op["responses"].get("503")
            if unavailable is not None:
                assert "Retry-After" in unavailable.get("headers", {}), (method, path)
