"""The operator page's inputs: its Retry/Skip forms and its owner search, read strictly
(a bad one is a `BadInput`, a 400 page, and nothing is written); the web token's field,
which the HTTP edge takes out of a form before it is read (`app.ops.web`)."""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Final, TypeVar, cast

from aiohttp import BodyPartReader, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import MultiDict, MultiMapping
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from yarl import URL

from app.errors import BadInput, TickwheelError
from app.protocol.topics import parse_aggregate_type
from tables import DEFAULT_TENANT, AggregateRef
from tables.refs import unusable_request_id

__all__ = [
    "TOKEN_FIELD",
    "OperatorForm",
    "form_target",
    "local_path",
    "new_form_id",
    "owner_query",
    "parse_form",
    "path_problem",
    "problems",
    "without_token",
]

V = TypeVar("V")

TOKEN_FIELD = "web_token"
"""The form field that carries the node's web token (`TICKWHEEL_WEB_TOKEN`)."""


def new_form_id() -> str:
    """A form's request id, new at each rendering of the page: the form submitted twice is
    one request twice, carried out once."""
    return uuid.uuid4().hex


class OperatorForm(BaseModel):
    """A Retry or Skip form: the owner type of the parked timers and their target, and
    the form's request id (none from a page an older node rendered: a fresh one then)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(min_length=1, description="the timers' owner type, <context>.<aggregate>")
    target_type: str = Field(min_length=1, description="the target's type")
    target_tenant: str = Field(default=DEFAULT_TENANT, min_length=1)
    target_id: str = Field(min_length=1)
    request_id: str | None = Field(default=None, min_length=1, max_length=100)
    back: str = "/"
    past_window: bool = Field(
        default=False,
        description='a Retry\'s "past the request-id window" box: also the parked timers '
        "whose slot their target may have forgotten (`TimerOp.past_window`)",
    )

    @field_validator("request_id")
    @classmethod
    def _usable(cls, value: str | None) -> str | None:
        # The one rule of every sender of a change (`unusable_request_id`: the CLI, the
        # JSON routes, the page's buttons): a control character garbles the logs and
        # pages that print the id. (The form's fields come stripped: no spaces around.)
        if value is not None and unusable_request_id(value):
            raise ValueError(
                f"{value[:80]!r}: give 1-100 characters, no surrounding spaces or control "
                "characters"
            )
        return value


def owner_query(query: MultiMapping[str]) -> tuple[str, str] | None:
    """`(owner id, tenant)` of an owner search, None when there is none."""
    for name in ("owner", "tenant"):
        if len(query.getall(name, [])) > 1:
            raise BadInput(f"{name} given more than once")
    owner = query.get("owner", "").strip()
    if not owner:
        return None
    tenant = query.get("tenant", "").strip() or DEFAULT_TENANT
    return owner, tenant


def without_token(form: MultiMapping[V]) -> MultiDict[V]:
    """`form` without its web token field (every other field as given, twice if twice)."""
    return MultiDict((name, value) for name, value in form.items() if name != TOKEN_FIELD)


def parse_form(form: MultiMapping[object]) -> OperatorForm:
    fields: dict[str, str] = {}
    for name in form:
        values = form.getall(name)
        if len(values) > 1:
            raise BadInput(f"form field {name!r} given more than once")
        value = values[0]
        if not isinstance(value, str):
            raise BadInput(f"form field {name!r} is not text")
        fields[name] = value.strip()
    if not fields.get("target_tenant"):
        fields.pop("target_tenant", None)
    try:
        return OperatorForm.model_validate(fields)
    except ValidationError as exc:
        raise BadInput(f"bad form: {problems(exc)}") from exc


def form_target(form: OperatorForm) -> AggregateRef:
    try:
        topics = parse_aggregate_type(form.target_type)
    except TickwheelError as exc:
        raise BadInput(f"bad target_type: {exc}") from exc
    try:
        return AggregateRef(
            context=topics.context,
            aggregate=topics.aggregate,
            tenant=form.target_tenant,
            id=form.target_id,
        )
    except ValidationError as exc:
        raise BadInput(f"bad target: {problems(exc)}") from exc


MAX_FORM_FIELDS: Final = 1_000
"""The fields a multipart form may have: the edge's forms have a handful."""

_FORM_KEY: Final = web.RequestKey[MultiMapping[str | bytes]]("tickwheel.form")


async def posted_form(request: web.Request) -> MultiMapping[str | bytes]:
    """The request's form, read once (the guard reads it, then the route); a body no form
    parser reads (a multipart body without its boundary, an unknown charset, bytes not of
    its charset, a part's headers malformed or its transfer encoding unknown, a file part)
    is a 400, not a 500."""
    if _FORM_KEY in request:
        return request[_FORM_KEY]
    try:
        if request.content_type == "multipart/form-data":
            form: MultiMapping[str | bytes] = await _multipart(request)
        else:
            form = cast(MultiMapping[str], await request.post())
    # aiohttp's multipart reader raises a RuntimeError for a part's unknown encoding and
    # an HttpProcessingError for its bad headers: the client's bytes, as the others.
    except (
        ValueError,
        LookupError,
        UnicodeError,
        AssertionError,
        RuntimeError,
        HttpProcessingError,
    ) as exc:
        raise web.HTTPBadRequest(reason=f"the form cannot be read: {type(exc).__name__}") from exc
    request[_FORM_KEY] = form
    return form


async def _multipart(request: web.Request) -> MultiDict[str | bytes]:
    """A multipart form's fields, as aiohttp's `post` reads them but for a file part, which
    is refused (no form here takes one) before anything of it is kept: `post` spools one to
    a temporary file, which it leaves unclosed when a later part fails to read."""
    out: MultiDict[str | bytes] = MultiDict()
    reader = await request.multipart()
    body, limit = request.content, request.client_max_size
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise ValueError("a multipart part inside a part")
        if part.name is None:
            raise ValueError("a part without a name")
        if part.filename:
            raise ValueError(f"part {part.name[:40]!r} is a file: no form here takes one")
        if len(out) >= MAX_FORM_FIELDS:
            raise ValueError(f"more than {MAX_FORM_FIELDS} fields")
        raw = bytearray()
        while chunk := await part.read_chunk():
            if 0 < limit < body.total_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=body.total_bytes)
            raw.extend(chunk)
        value = bytearray()
        async for decoded in part.decode_iter(raw):
            value.extend(decoded)
        kind = part.headers.get(hdrs.CONTENT_TYPE)
        if kind is None or kind.startswith("text/"):
            out.add(part.name, value.decode(part.get_charset(default="utf-8")))
        else:
            out.add(part.name, bytes(value))
    return out


def query_problem(query: MultiMapping[str], raw: str) -> str | None:
    """What is wrong with a request's query as a whole, or None: a parameter given twice
    (read as its first, the second was dropped without a word), or percent-encoded bytes
    that are no UTF-8 (decoded to U+FFFD: a tenant or request id no one wrote). `raw`:
    the query string as sent."""
    seen: set[str] = set()
    for name, _ in query.items():  # every pair (iterating a MultiDict gives each name once)
        if name in seen:
            return f"{name} given more than once"
        seen.add(name)
    decoded = any("\ufffd" in k or "\ufffd" in v for k, v in query.items())
    if decoded and "%EF%BF%BD" not in raw.upper() and "\ufffd" not in raw:
        return "the query's percent-encoded bytes are not UTF-8"
    return None


def path_problem(raw_path: str) -> str | None:
    """What is wrong with a request's path as sent (`raw_path`, no query), or None: a
    segment whose percent-escapes are no UTF-8. The router kept such a segment as its
    escapes (`%ED%A0%80` a key of nine characters, the key `%25ED%25A0%2580` names too)."""
    for segment in raw_path.split("/"):
        if "%" not in segment:
            continue
        try:
            urllib.parse.unquote_to_bytes(segment).decode("utf-8")
        except UnicodeDecodeError:
            return f"path segment {segment[:100]!r}: its percent-encoded bytes are not UTF-8"
    return None


def local_path(back: str) -> str:
    """`back` if it is a path of this server, else the page: a form cannot send the
    browser elsewhere."""
    try:
        url = URL(back)
    except (ValueError, UnicodeError):
        return "/"  # no URL at all (`http://[`, a port past 65535): never a 500 after the act
    if url.is_absolute() or not back.startswith("/") or back.startswith("//"):
        return "/"
    if "\\" in back or any(c < " " or c == "\x7f" for c in back):
        # Browsers read "/\\host" as "//host", and drop a tab or a newline from a URL:
        # "/\t/host" is "//host" too, another site.
        return "/"
    return back


def problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
