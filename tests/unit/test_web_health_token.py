"""The HTTP edge's health for an orchestrator's two questions (`/livez`: the process
answers; `/readyz`, and `/healthz` as before: the node owns and runs its partitions, the
broker answers, no commit waits too long) and its web token: every action needs it
(`Authorization: Bearer`, or the operator page's token form and then a cookie), reads
stay open. The fake node of the page's tests, behind the real `WebServer`."""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from fakes import GOOD, NODE, PAGE_PARTITIONS, TYPE, FakeNode, Recorder, asking, ref
from yarl import URL

from app.node.settings import Settings
from app.ops.page import OperatorPage
from app.ops.web import TOKEN_COOKIE, WebServer
from app.protocol.wire import TimerAction

P = PAGE_PARTITIONS
TOKEN = "a-long-random-web-token"
HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
"""What a browser's form post accepts."""


@dataclass
class HealthNode(FakeNode):
    """The page's fake node, with what the health endpoints read beyond readiness."""

    reachable: bool = True
    failed: str | None = None
    commit_lag_s: float | None = None

    def health(self) -> dict[str, Any]:
        body = super().health()
        body["broker"] = {"reachable": self.reachable}
        body["ready"] = body["ready"] and self.reachable and self.failed is None
        if self.failed is not None:
            body["failed"] = self.failed
        if self.commit_lag_s is not None:
            body["commit_lag_s"] = self.commit_lag_s
        return body


@dataclass
class Edge:
    node: HealthNode
    url: URL
    http: aiohttp.ClientSession
    retry: Recorder

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.url.with_path(path)) as r:
            body = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, body

    async def post(
        self, data: Any, headers: dict[str, str] | None = None, path: str = "/timers/retry"
    ) -> aiohttp.ClientResponse:
        async with self.http.post(
            self.url.with_path(path), data=data, headers=headers, allow_redirects=False
        ) as r:
            await r.read()
            return r


Serve = Callable[..., Any]


@pytest.fixture
def serve() -> Serve:
    @asynccontextmanager
    async def serving(
        token: str | None = None, web_url: str | None = None, **node: Any
    ) -> AsyncIterator[Edge]:
        settings = Settings(
            partitions=P, group_id="g1", bootstrap_servers="b:1", web_token=token, web_url=web_url
        )
        fake = HealthNode(settings=settings, **node)
        server = WebServer(fake, 0)  # type: ignore[arg-type]
        await server.start()
        retry, skip = Recorder(TimerAction.RETRY), Recorder(TimerAction.SKIP)
        server.page = OperatorPage(fake, NODE, ask=asking(retry, skip))
        try:
            jar = aiohttp.CookieJar(unsafe=True)  # keeps a loopback address's cookies
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                yield Edge(fake, URL(f"http://127.0.0.1:{server.port}"), http, retry)
        finally:
            await server.stop()

    return serving


# --- health --------------------------------------------------------------------------------


async def test_liveness_holds_while_the_node_is_not_ready(serve: Serve) -> None:
    async with serve(restoring=[1], reachable=False) as edge:
        status, body = await edge.get("/livez")
        assert status == 200
        assert body["live"] is True and body["uptime_s"] >= 0
        assert set(body) == {"live", "uptime_s"}
        assert (await edge.get("/readyz"))[0] == 503


async def test_a_node_failed_for_good_is_not_live(serve: Serve) -> None:
    async with serve(failed="the local store is gone") as edge:
        status, body = await edge.get("/livez")
        assert status == 503
        assert body["live"] is False and body["failed"] == "the local store is gone"


@pytest.mark.parametrize(
    ("node", "ready"),
    [
        ({}, True),
        ({"restoring": [2]}, False),
        ({"stalled": {"1": "shop.order: timer rounds failing"}}, False),
        ({"reachable": False}, False),
        ({"failed": "boom"}, False),
        ({"commit_lag_s": 1.5}, True),
    ],
)
async def test_readiness_is_the_nodes_health_and_healthz_says_the_same(
    serve: Serve, node: dict[str, Any], ready: bool
) -> None:
    async with serve(**node) as edge:
        status, body = await edge.get("/readyz")
        assert (status, body["ready"]) == ((200, True) if ready else (503, False))
        assert body["owned"] == edge.node.owned
        assert await edge.get("/healthz") == (status, body)


async def test_health_is_read_only(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        for path in ("/livez", "/readyz", "/healthz"):
            r = await edge.post({}, path=path)
            assert r.status == 405, path


# --- the web token -------------------------------------------------------------------------


async def test_without_a_token_set_actions_are_open(serve: Serve) -> None:
    async with serve() as edge:
        r = await edge.post(GOOD)
        assert r.status == 303 and len(edge.retry.calls) == 1


async def test_reads_stay_open_with_a_token_set(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        for path in ("/", "/livez", "/readyz", "/healthz", "/ledger"):
            status, _ = await edge.get(path)
            assert status == 200, path


async def test_an_action_without_the_token_is_refused_and_sends_nothing(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        r = await edge.post(GOOD)
        assert r.status == 401
        assert r.headers["WWW-Authenticate"] == 'Bearer realm="tickwheel"'
        for wrong in ("Bearer nope", "bearer", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"):
            r = await edge.post(GOOD, {"Authorization": wrong})
            assert r.status == 401, wrong
            assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]
        # Another scheme is no token (a proxy's own), and no wrong one either.
        r = await edge.post(GOOD, {"Authorization": f"Basic {TOKEN}"})
        assert r.status == 401
        assert r.headers["WWW-Authenticate"] == 'Bearer realm="tickwheel"'
        r = await edge.post({**GOOD, "web_token": "nope"})
        assert r.status == 401
        assert edge.retry.calls == []


async def test_the_bearer_token_carries_out_an_action(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        r = await edge.post(GOOD, {"Authorization": f"Bearer {TOKEN}"})
        assert r.status == 303
        assert edge.retry.calls == [("b:1", TYPE, ref("t-1"), P)]
        r = await edge.post(GOOD, {"Authorization": f"bearer  {TOKEN} "}, path="/timers/skip")
        assert r.status == 303
        assert TOKEN_COOKIE not in r.cookies  # no browser: nothing to remember


async def test_the_token_is_compared_in_constant_time(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", compare)
    async with serve(token=TOKEN) as edge:
        await edge.post(GOOD, {"Authorization": "Bearer nope"})
    ((given, expected),) = compared
    assert len(given) == len(expected)  # digests: not even the length is compared


def hidden_fields(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', html)


async def test_a_browsers_form_is_asked_for_the_token_then_carried_out(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        form = {**GOOD, "back": "/?owner=o1"}
        r = await edge.post(form, HTML)
        assert r.status == 401 and r.content_type == "text/html"
        html = await r.text()
        assert "this node's web token is needed" in html
        assert 'action="/timers/retry"' in html
        assert 'type="password" name="web_token"' in html
        assert "not this node" not in html
        fields = hidden_fields(html)
        assert dict(fields) == {**form, "back": "/?owner=o1"}
        assert edge.retry.calls == []

        # The page's form, posted again with a wrong token: asked again, nothing sent.
        r = await edge.post([*fields, ("web_token", "nope")], HTML)
        assert r.status == 401 and "That is not this node's web token." in await r.text()
        assert edge.retry.calls == [] and TOKEN_COOKIE not in r.cookies

        r = await edge.post([*fields, ("web_token", f" {TOKEN} ")], HTML)
        assert r.status == 303
        assert URL(r.headers["Location"]).query["owner"] == "o1"
        assert edge.retry.calls == [("b:1", TYPE, ref("t-1"), P)]
        cookie = r.cookies[TOKEN_COOKIE]
        assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
        assert TOKEN not in cookie.value

        # The cookie then stands for the token: the next form goes through at once.
        r = await edge.post(GOOD, HTML, path="/timers/skip")
        assert r.status == 303


async def test_a_wrong_cookie_is_no_token(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        edge.http.cookie_jar.update_cookies({TOKEN_COOKIE: TOKEN}, edge.url)
        r = await edge.post(GOOD, HTML)
        assert r.status == 401
        assert edge.retry.calls == []


async def test_the_token_page_escapes_what_the_form_held(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        r = await edge.post({**GOOD, "back": '/"><script>x</script>'}, HTML)
        html = await r.text()
        assert "<script>x" not in html
        assert "&#34;&gt;&lt;script&gt;x&lt;/script&gt;" in html


async def test_a_form_from_another_site_is_refused_even_with_the_token(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        headers = {"Authorization": f"Bearer {TOKEN}", "Origin": "http://elsewhere.example"}
        r = await edge.post(GOOD, headers)
        assert r.status == 403
        assert edge.retry.calls == []


async def test_the_token_field_is_no_field_of_the_form(serve: Serve) -> None:
    async with serve(token=TOKEN) as edge:
        r = await edge.post({**GOOD, "web_token": TOKEN, "extra": "1"}, HTML)
        assert r.status == 400
        assert "extra: Extra inputs are not permitted" in await r.text()
        assert "web_token" not in await r.text()
    async with serve() as edge:  # no token set: a field given anyway is let through
        r = await edge.post({**GOOD, "web_token": "whatever"})
        assert r.status == 303


async def raw_post(edge: Edge, header: bytes) -> int:
    """A form posted with one header line of raw bytes (not UTF-8: no client sends it)."""
    assert edge.url.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.url.port)
    body = b"tenant=default"
    writer.write(
        b"POST /timers/retry HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        + header
        + b"\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    await writer.wait_closed()
    return status


async def test_a_token_or_cookie_that_is_not_utf8_is_a_wrong_one(serve: Serve) -> None:
    """aiohttp hands such bytes on as lone surrogates; they were encoded strictly, a 500."""
    async with serve(token=TOKEN) as edge:
        assert await raw_post(edge, b"Authorization: Bearer \xff\xfe") == 401
        assert await raw_post(edge, b"Cookie: " + TOKEN_COOKIE.encode() + b"=\xff\xfe") == 401
        assert edge.retry.calls == []


async def test_a_browsers_write_to_a_name_the_node_does_not_know_is_refused_without_a_token(
    serve: Serve,
) -> None:
    """DNS rebinding: a page of the attacker's name, resolved to this node's address,
    posts to it; its origin and the request's Host agree, so the same-site check passes.
    Without a token, a browser's write must come to an IP address, localhost, or the host
    of TICKWHEEL_WEB_URL; a client that is no browser is let through as before."""
    async with serve() as edge:
        port = edge.url.port
        rebound = {
            "Host": f"evil.example:{port}",
            "Origin": f"http://evil.example:{port}",
            "Sec-Fetch-Site": "same-origin",
        }
        r = await edge.post(GOOD, rebound)
        assert r.status == 403
        assert edge.retry.calls == []
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            same = {"Host": host, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"}
            assert (await edge.post(GOOD, same)).status == 303, host
        assert (await edge.post(GOOD, {"Host": f"evil.example:{port}"})).status == 303  # curl
    async with serve(web_url="http://Tickwheel.Internal:9400") as edge:
        port = edge.url.port
        named = {
            "Host": f"tickwheel.internal:{port}",
            "Origin": f"http://tickwheel.internal:{port}",
            "Sec-Fetch-Site": "same-origin",
        }
        assert (await edge.post(GOOD, named)).status == 303
    async with serve(token=TOKEN) as edge:  # the token decides
        port = edge.url.port
        rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        assert (await edge.post(GOOD, rebound)).status == 401
        rebound["Authorization"] = f"Bearer {TOKEN}"
        assert (await edge.post(GOOD, rebound)).status == 303


def test_the_names_a_browser_may_reach_the_node_under_are_its_links_and_its_host() -> None:
    """The other nodes' pages link to TICKWHEEL_WEB_URL, else to its host and port: a
    browser following either link is at a known name (a trailing dot or capitals as any)."""
    settings = Settings(
        partitions=P,
        group_id="g1",
        bootstrap_servers="b:1",
        web_host="TW-Node",
        web_url="http://TW.Internal.:9400",
    )
    server = WebServer(HealthNode(settings=settings), 0)  # type: ignore[arg-type]
    assert server._guard.names == {"tw-node", "tw.internal"}
