"""Hostile requests at the HTTP edge (`app.ops.web` and every route it adds), generated: no
request is answered 5xx (but the documented ones: readiness's 503, a write's 503 or 504
when the book or the schedule did not answer), none shows a traceback, none is logged
with one (a client's malformed request is an INFO line, `app.ops.client_faults`), the
node still answers `/livez` afterwards and a timer set before is still there.

Each request is written to the socket as raw bytes (odd methods, percent-encoded bytes
that are no UTF-8, NUL, unicode separators, huge and repeated parameters, bodies that
are not JSON or nest deep, wrong content types and encodings, odd `Host`, `Origin`,
`Authorization`, cookie and `Idempotency-Key` headers), to a node on the in-memory log
with its web token (`fakes.web_node`); about half carry the right token, so that the
routes' own reading of their input is reached. A few cases found by hand are pinned
below the fuzzers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError
from fakes import MIN, T0, WEB_TOKEN, FakeClock, WebNode, web_node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.clients.timer_book import timer_book
from app.jobs import Job, JobRun, JobScope
from app.log_limit import LogLimit
from app.model.aggregate import AggregateType, Command, Decision
from app.ops.client_faults import ClientFaults, client_fault
from app.service import Service
from tables import AggregateRef, IntervalRule

P = 2
BOOK = "shop.reminders"
KEPT = f"/timers/{BOOK}/kept-owner/kept"
"""A timer set before the fuzzing: still there after it (nothing stored is lost)."""


class Pings(BaseModel):
    n: int = 0


order = AggregateType("shop", "order", Pings)


@order.command("RemindToPay")
def _ping(state: Pings, cmd: Command, d: Decision) -> None:
    d.emit("Pinged", {"n": state.n + 1})


def _run(run: JobRun) -> None:
    run.send(AggregateRef(context="shop", aggregate="order", id="o-1"), "RemindToPay", {})


_EVERY_MIN = IntervalRule(start=T0, every=MIN)
SERVICE = Service(
    aggregates=(timer_book("shop", "reminders"), order),
    jobs={
        "shop": (
            Job("minutely", JobScope.SYSTEM, _EVERY_MIN, _run),
            Job("per-tenant", JobScope.TENANT, _EVERY_MIN, _run),
            Job("sweep", JobScope.SHARDED, _EVERY_MIN, _run),
        )
    },
)


@contextlib.asynccontextmanager
async def serving(data: Path, token: str | None) -> AsyncIterator[WebNode]:
    """The node of `SERVICE` with its web edge, and `KEPT` set."""
    async with web_node(SERVICE, data, FakeClock(T0), WebNode, partitions=P, token=token) as e:
        body = {
            "rule": {"kind": "once", "at": T0 + 3_600_000},
            "target": {"type": "shop.order", "id": "o-1"},
            "command": {"type": "RemindToPay", "body": {}},
        }
        status, answer = await e.call("PUT", KEPT, body)
        assert status == 200, answer
        yield e


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[WebNode]:
    """A node with the web token `WEB_TOKEN`."""
    async with serving(tmp_path, WEB_TOKEN) as e:
        yield e


@pytest.fixture(params=[WEB_TOKEN, None], ids=["token", "no-token"])
async def any_edge(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[WebNode]:
    """A node with the web token, and one without (its writes guarded by the origin
    checks alone: `app.ops.origin`)."""
    async with serving(tmp_path, request.param) as e:
        yield e


# --- raw HTTP ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def send(edge: WebNode, request: bytes) -> Answer:
    """`request` written as it is; the answer read to its end (each closes its connection)."""
    assert edge.url.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.url.port)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1."), raw[:200]
    fields = (line.partition(":") for line in lines[1:])
    return Answer(int(lines[0].split()[1]), {k.lower(): v.strip() for k, _, v in fields}, body)


def request_bytes(
    method: str,
    target: str,
    headers: list[tuple[str, bytes]],
    body: bytes | None,
    host: bytes = b"127.0.0.1",
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: " + host]
    lines += [name.encode() + b": " + value for name, value in headers]
    if body is not None:
        lines.append(b"Content-Length: %d" % len(body))
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


# --- what a fuzzer sends ------------------------------------------------------------------

_ODD = [
    "",
    ".",
    "..",
    "%00",
    "%FF",
    "%ED%A0%80",
    "%2F",
    "%2e%2e",
    "%E2%80%A8",
    "%C0%AF",
    "a%20b",
    "%25",
    "NaN",
    "-1",
    "1e309",
    "99999999999999999999999",
    "0",
]


def _quoted(text: str) -> str:
    return urllib.parse.quote(text, safe="")


segments = st.one_of(
    st.sampled_from(["shop.reminders", "shop.order", "shop", "minutely", "sweep", "o-1", "k"]),
    st.sampled_from(_ODD),
    st.integers(100, 3000).map(lambda n: "x" * n),
    st.text(max_size=40).map(_quoted),
    st.binary(max_size=20).map(lambda b: "".join(f"%{x:02X}" for x in b)),
)

ROUTES = [
    "/livez",
    "/readyz",
    "/healthz",
    "/metrics",
    "/ledger",
    "/timers/upcoming",
    "/openapi.json",
    "/",
    "/jobs",
    "/timers/retry",
    "/timers/skip",
    "/page/timer",
    "/page/job",
]
TEMPLATES = [
    "/timers/{}/{}/{}",
    "/timers/{}/{}/{}/pause",
    "/timers/{}/{}/{}/resume",
    "/timers/{}/{}/{}/trigger",
    "/jobs/{}/{}/trigger",
    "/jobs/{}/{}/enable",
    "/jobs/{}/{}/disable",
    "/jobs/{}/{}/reschedule",
    "/jobs/{}/{}/backfill",
    "/{}",
    "/timers/{}",
    "/{}/{}/{}/{}/{}",
]


@st.composite
def paths(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.sampled_from(ROUTES))
    template = draw(st.sampled_from(TEMPLATES))
    return template.format(*(draw(segments) for _ in range(template.count("{}"))))


PARAMS = [
    "type",
    "owner",
    "tenant",
    "target",
    "target_type",
    "due_from",
    "due_until",
    "limit",
    "cursor",
    "context",
    "job",
    "state",
    "request_id",
    "done",
]
values = st.one_of(
    st.sampled_from(_ODD),
    st.sampled_from(["true", "false", "TRUE", "shop.reminders", "shop", "minutely", "1000"]),
    st.integers().map(str),
    st.text(max_size=30).map(_quoted),
    st.binary(max_size=12).map(lambda b: "".join(f"%{x:02X}" for x in b)),
)
queries = st.lists(
    st.tuples(st.one_of(st.sampled_from(PARAMS), st.text(max_size=8).map(_quoted)), values),
    max_size=5,
).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))

FORM = "application/x-www-form-urlencoded"
MULTIPART = b"multipart/form-data; boundary=b"
AUTH = ("Authorization", f"Bearer {WEB_TOKEN}".encode())
HOSTS = [
    b"127.0.0.1",
    b"localhost",
    b"evil.example",
    b"[::1]",
    b"[::1",
    b"a..b",
    b"127.0.0.1:99999",
    b"\xc3\xbc.example",
    b"\xff",
    b"",
]
header_values = st.one_of(
    st.sampled_from([b"", b"x", b"\xff\xfe", "\u2028".encode(), b'"a\\"b;']),
    st.integers(100, 8000).map(lambda n: b"a" * n),
    st.binary(max_size=30).map(lambda b: bytes(c for c in b if c not in b"\r\n")),
)
headers = st.lists(
    st.one_of(
        st.tuples(
            st.just("Authorization"),
            st.one_of(
                st.just(f"Bearer {WEB_TOKEN}".encode()),
                st.just(f"bearer  {WEB_TOKEN} ".encode()),
                header_values.map(lambda v: b"Bearer " + v),
                header_values,
            ),
        ),
        st.tuples(
            st.sampled_from(
                ["Idempotency-Key", "Cookie", "Origin", "Sec-Fetch-Site", "Accept", "X-Odd"]
            ),
            header_values,
        ),
        st.tuples(st.just("Cookie"), header_values.map(lambda v: b"tickwheel_web_token=" + v)),
        st.tuples(st.just("Origin"), st.sampled_from([b"http://127.0.0.1", b"http://[", b"null"])),
        st.tuples(st.just("Origin"), st.sampled_from(HOSTS).map(lambda h: b"http://" + h)),
        st.tuples(
            st.just("Sec-Fetch-Site"),
            st.sampled_from([b"same-origin", b"none", b"cross-site", b"same-site"]),
        ),
        st.tuples(st.just("Accept"), st.just(b"text/html")),
        st.tuples(
            st.just("Content-Encoding"), st.sampled_from([b"gzip", b"deflate", b"identity", b"x"])
        ),
    ),
    max_size=6,
    unique_by=lambda h: h[0].lower(),
)

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
rules = st.fixed_dictionaries(
    {"kind": st.sampled_from(["once", "interval", "cron", "x"])},
    optional={
        "at": st.one_of(st.integers(), st.just(T0 + 60_000)),
        "every": st.one_of(st.integers(), st.just(MIN)),
        "start": st.integers(),
        "expr": st.sampled_from(["* * * * *", "0 0 31 2 *", "x", "*/0 * * * *"]),
        "zone": st.sampled_from(["UTC", "Europe/Paris", "../etc", "", "x" * 300]),
        "until": st.integers(),
        "count": st.integers(),
    },
)
bodies_json = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "rule": st.one_of(rules, json_values),
            "target": st.one_of(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["shop.order", "shop.reminders", "x"])},
                    optional={"id": st.text(max_size=10)},
                ),
                json_values,
            ),
            "command": st.one_of(
                st.fixed_dictionaries({"type": st.just("RemindToPay"), "body": json_values}),
                json_values,
            ),
            "request_id": st.one_of(st.text(max_size=10), json_values),
            "tenants": st.one_of(st.lists(st.text(max_size=5), max_size=3), json_values),
            "partition": st.one_of(st.integers(), json_values),
            "from": st.one_of(st.integers(), st.text(max_size=30)),
            "until": st.one_of(st.integers(), st.text(max_size=30)),
            "dry_run": st.booleans(),
        },
    ),
).map(lambda v: json.dumps(v).encode())  # integers past 64 bits too
FORM_FIELDS = [
    "type",
    "target_type",
    "target_tenant",
    "target_id",
    "back",
    "web_token",
    "action",
    "owner",
    "tenant",
    "key",
    "request_id",
    "context",
    "job",
]
bodies_form = st.lists(
    st.tuples(st.one_of(st.sampled_from(FORM_FIELDS), st.text(max_size=5)), values),
    max_size=8,
).map(lambda pairs: "&".join(f"{_quoted(k)}={v}" for k, v in pairs).encode())
PART_HEADERS = [
    b"Content-Transfer-Encoding: base64",
    b"Content-Transfer-Encoding: quoted-printable",
    b"Content-Transfer-Encoding: x-odd",
    b"Content-Encoding: gzip",
    b"Content-Encoding: x-odd",
    b"Content-Type: text/plain; charset=klingon",
    b"Content-Type: application/octet-stream",
    b"Content-Length: zz",
    b"Bad Header: 1",
    b"X: " + b"y" * 9000,
]


@st.composite
def bodies_multipart(draw: st.DrawFn) -> bytes:
    """A multipart form (boundary `b`) of fields with odd part headers."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.one_of(st.sampled_from(FORM_FIELDS), st.text(max_size=5)))
        head = [b'Content-Disposition: form-data; name="%s"' % _quoted(name).encode()]
        if draw(st.booleans()):
            head[0] += b'; filename="f"'
        head += draw(st.lists(st.sampled_from(PART_HEADERS), max_size=2))
        value = draw(st.one_of(values.map(str.encode), st.binary(max_size=20)))
        parts.append(b"--b\r\n" + b"\r\n".join(head) + b"\r\n\r\n" + value + b"\r\n")
    return b"".join(parts) + b"--b--\r\n"


CONTENT_TYPES = [
    b"application/json",
    FORM.encode(),
    FORM.encode() + b"; charset=klingon",
    b"multipart/form-data",
    MULTIPART,
    b"text/plain",
    b"application/json; charset=utf-16",
]
bodies = st.one_of(
    st.tuples(st.none(), st.none()),
    st.tuples(st.just(b"application/json"), bodies_json),
    st.tuples(st.just(FORM.encode()), bodies_form),
    st.tuples(st.just(MULTIPART), bodies_multipart()),
    st.tuples(
        st.one_of(st.none(), st.sampled_from(CONTENT_TYPES)),
        st.one_of(
            bodies_json,
            bodies_form,
            bodies_multipart(),
            st.binary(max_size=64),
            st.sampled_from([b"NaN", b"1e309", b'{"a":1,"a":2}', b"\x1f\x8b", b"\xef\xbb\xbf{}"]),
            st.integers(1, 5000).map(lambda n: b"[" * n),  # nested past the parser's limit
            st.integers(1, 3000).map(lambda n: b'{"a":' * n),
        ),
    ),
)
"""A body and its `Content-Type` (None: no header), most often the body's own."""
methods = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])

_WRITE_ANSWERS = frozenset({503, 504})
"""A write's documented 5xx: its partition busy, the broker away, no answer in time."""


def assert_answered(method: str, path: str, got: Answer) -> None:
    """A 4xx (or a success), never a 5xx but the documented ones, never a traceback."""
    assert b"Traceback" not in got.body, got.body[:2000]
    if got.status < 500:
        return
    if path.split("?")[0] in ("/readyz", "/healthz") and got.status == 503:
        return
    reads = ("GET", "HEAD", "OPTIONS")
    assert method not in reads and got.status in _WRITE_ANSWERS, (got.status, got.body[:2000])


async def still_there(edge: WebNode) -> None:
    """The node goes on: alive, and the timer set before the fuzzing kept."""
    live = await send(edge, request_bytes("GET", "/livez", [], None))
    assert live.status == 200, live.body
    kept = await send(edge, request_bytes("GET", KEPT, [], None))
    assert kept.status == 200 and orjson.loads(kept.body)["status"] == "PENDING", kept.body


_FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What was logged with a traceback (by the node or by aiohttp's server)."""
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info is not None]


@_FUZZ
@given(methods, paths(), queries, headers, bodies, st.booleans(), st.sampled_from(HOSTS))
async def test_no_generated_request_is_answered_5xx_and_the_node_goes_on(
    any_edge: WebNode,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    query: str,
    extra: list[tuple[str, bytes]],
    typed_body: tuple[bytes | None, bytes | None],
    authorized: bool,
    host: bytes,
) -> None:
    target = f"{path}?{query}" if query else path
    content_type, body = typed_body
    if content_type is not None:
        extra = [*extra, ("Content-Type", content_type)]
    if authorized and all(name != "Authorization" for name, _ in extra):
        extra = [AUTH, *extra]
    got = await send(any_edge, request_bytes(method, target, extra, body, host))
    assert_answered(method, target, got)
    await still_there(any_edge)
    assert tracebacks(caplog) == []


# --- found by hand ---------------------------------------------------------------------


_BODY_ROUTES = [
    ("PUT", "/timers/shop.reminders/o-1/k", []),
    ("POST", "/timers/shop.reminders/o-1/k/pause", []),
    ("POST", "/jobs/shop/minutely/trigger", []),
    ("POST", "/page/timer", [("Content-Type", FORM.encode())]),
    ("POST", "/timers/retry", [("Content-Type", FORM.encode())]),
]


def commands_sent(edge: WebNode) -> int:
    """Records written to the commands and timer-ops topics: an operator's requests."""
    log = edge.log
    topics = [t for t in log.topic_names() if t.endswith((".commands", ".timer-ops"))]
    return sum(log.offsets(t, p, committed=False)[1] for t in topics for p in range(P))


async def test_a_body_its_content_encoding_does_not_decode_is_a_400(edge: WebNode) -> None:
    """`Content-Encoding: gzip` on bytes that are none: aiohttp fails to read the body (a
    `RequestPayloadError`), which was a 500; a 400 naming it, and nothing sent."""
    sent = commands_sent(edge)
    for encoding in (b"gzip", b"deflate"):
        for method, path, extra in _BODY_ROUTES:
            headers = [AUTH, ("Content-Encoding", encoding), *extra]
            got = await send(edge, request_bytes(method, path, headers, b"not compressed"))
            assert got.status == 400, (path, got.body)
            answer = orjson.loads(got.body)
            assert answer["error"].startswith("the body cannot be read: "), answer
            assert encoding.decode() in answer["error"]
    assert commands_sent(edge) == sent
    await still_there(edge)


async def test_a_path_whose_percent_escapes_are_not_utf8_is_a_400_naming_its_segment(
    edge: WebNode,
) -> None:
    """The router kept such a segment as its escapes: `PUT .../o/%ED%A0%80` stored the key
    `%ED%A0%80`, which `.../o/%25ED%25A0%2580` names too (the same bytes in the query were
    a 400 already)."""
    body = {
        "rule": {"kind": "once", "at": T0 + 3_600_000},
        "target": {"type": "shop.order", "id": "o-1"},
        "command": {"type": "RemindToPay", "body": {}},
    }
    json_body = [AUTH, ("Content-Type", b"application/json")]
    escaped = request_bytes(
        "PUT", f"/timers/{BOOK}/o/%25ED%25A0%2580", json_body, json.dumps(body).encode()
    )
    assert (await send(edge, escaped)).status == 200  # the key "%ED%A0%80", as written
    sent = commands_sent(edge)
    bad = "%ED%A0%80"  # a lone surrogate's bytes
    for method, path, data in [
        ("GET", f"/timers/{BOOK}/o/{bad}", None),
        ("PUT", f"/timers/{BOOK}/o/{bad}", json.dumps(body).encode()),
        ("DELETE", f"/timers/{BOOK}/o/{bad}", None),
        ("POST", f"/timers/{BOOK}/o/{bad}/pause", b"{}"),
        ("POST", f"/timers/{BOOK}/%FF/k/trigger", b"{}"),
        ("GET", "/timers/shop.%C0%AF/o/k", None),
        ("POST", "/jobs/shop/%FFminutely/trigger", b"{}"),
    ]:
        got = await send(edge, request_bytes(method, path, json_body, data))
        assert got.status == 400, (method, path, got.body)
        segment = next(s for s in path.split("/") if "%" in s)
        assert f"path segment {segment!r}" in orjson.loads(got.body)["error"], got.body
    assert commands_sent(edge) == sent


MALFORMED = [
    (b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400),  # no path
    (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
    (b"GET /livez HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n", 400),  # NUL in a header
    (b"GET /" + b"x" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400),  # line too long
    (b"GET /livez HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    # a body the route never read, read after it answered: its encoding fails then
    (
        b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nno",
        200,
    ),
]


async def test_a_malformed_request_is_logged_as_the_clients_without_a_traceback(
    edge: WebNode, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp logged each at ERROR with its traceback (anyone reaching the port could
    fill the log with them): an INFO line of `app.ops.client_faults` now, if any (one a
    minute of a kind), and the node goes on."""
    caplog.set_level(logging.DEBUG, logger="app.ops")
    for request, status in MALFORMED:
        got = await send(edge, request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
        assert got.status == status, (request[:60], got.body)
    assert tracebacks(caplog) == []
    assert all(
        r.levelno == logging.INFO for r in caplog.records if r.name == "app.ops.client_faults"
    )
    await still_there(edge)


async def test_a_client_gone_while_its_body_was_read_is_no_traceback(
    edge: WebNode, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that sends part of its body and goes away: aiohttp logged the route's
    `ConnectionResetError` as a 500 with a traceback; a DEBUG line now, nothing sent."""
    caplog.set_level(logging.DEBUG, logger="app.ops.json_answers")
    sent = commands_sent(edge)
    assert edge.url.port is not None
    _, writer = await asyncio.open_connection("127.0.0.1", edge.url.port)
    head = request_bytes("PUT", "/timers/shop.reminders/o-1/k", [AUTH], b"x" * 100)
    writer.write(head[:-90])  # ten bytes of the hundred promised
    await writer.drain()
    writer.close()
    deadline = asyncio.get_running_loop().time() + 10
    while not any("went away" in r.getMessage() for r in caplog.records):
        assert asyncio.get_running_loop().time() < deadline, tracebacks(caplog)
        await asyncio.sleep(0.01)
    assert tracebacks(caplog) == []
    assert commands_sent(edge) == sent
    await still_there(edge)


def _record(exc: BaseException) -> logging.LogRecord:
    """A record as aiohttp's server logs a request it failed on."""
    return logging.LogRecord(
        "app.ops.web.server", logging.ERROR, __file__, 1, "Error handling request from %s",
        ("10.0.0.7",), (type(exc), exc, None),
    )  # fmt: skip


def test_a_clients_fault_is_one_info_line_a_minute_of_its_kind_and_a_500_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    faults = ClientFaults(LogLimit(60.0, clock=lambda: now[0]))
    caplog.set_level(logging.INFO, logger="app.ops.client_faults")
    bad = BadHttpMessage("Invalid header value char:\n\n  b'X: \\x00'\n     ^")
    assert faults.filter(_record(bad)) is False  # dropped, an INFO line in its place
    assert faults.filter(_record(bad)) is False  # counted
    now[0] = 61.0
    assert faults.filter(_record(bad)) is False
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            logging.INFO,
            "Error handling request from 10.0.0.7: Invalid header value char: b'X: \\x00' "
            "(the client's fault, not this node's)",
        ),
        (
            logging.INFO,
            "Error handling request from 10.0.0.7: Invalid header value char: b'X: \\x00' "
            "(the client's fault, not this node's) (1 more like it in the last 61 s, not "
            "logged)",
        ),
    ]
    # A route's own failure, or an HTTP error of the server's, is logged as it came.
    assert faults.filter(_record(RuntimeError("a bug"))) is True
    assert faults.filter(_record(HttpProcessingError(code=500, message="x"))) is True
    assert client_fault(None) is None
