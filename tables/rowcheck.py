"""A restore's check of each changelog row: as strict as `Timer`'s, several times cheaper.

Restoring validates every row in full (a row a later read could not decode must never be
loaded), and pydantic's validation of a Timer costs ~7-10 µs a row on a small box, most
of it building five models a restore throws away. Here msgspec decodes the row into
plain structs carrying the same bounds (about a microsecond), and the checks msgspec
cannot express are made once per distinct value (names, bodies, cron expressions and
zones repeat across a type's timers). msgspec is stricter than pydantic's lax mode (no
`"3"` for an int, no `1.0`, no `"true"`): whatever it refuses is decided by pydantic
(`restored_row`), so it only ever costs time, never a different verdict. What msgspec
accepts pydantic accepts too, with the same values (`tests/unit/test_rowcheck.py` holds
the two to that on generated and mangled rows).
"""

from __future__ import annotations

import functools
import re
import struct
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from pydantic_core import from_json

from tables.bounds import MAX_INSTANT, MAX_INT64, check_stored
from tables.keys import (
    DUE,
    FINISHED,
    HELD,
    PARKED,
    encode_timer,
    finished_at,
    index_key,
    order_key,
    ref_parts,
    restored_row,
)
from tables.owners import TableOwners, id_hash
from tables.rules import MAX_JITTER, _cron_error
from tables.timer import MAX_ERROR_TEXT
from tables.zones import UnknownZone
from tables.zones import zone as tz_zone

__all__ = ["restored_index", "restored_index_as_is", "restored_model_index"]

_V = TypeVar("_V")

_Text200 = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
_Instant = Annotated[int, msgspec.Meta(ge=0, le=MAX_INSTANT)]
_Int64 = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)]
_Count = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT64)]
_Jitter = Annotated[int, msgspec.Meta(ge=1, le=MAX_JITTER)]

# `AggregateRef`'s pattern as the Rust regex pydantic runs reads it: `$` is the end of the
# text (Python's `$` would also match before a final newline, hence fullmatch).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


# `gc=False`: the structs hold only strings, numbers and other such structs (no cycle can
# form), so the collector never tracks the ~6 of them a row makes (on the 2-core box,
# decoding 20,000 rows into a list: 4.3-5.7 -> 2.4-2.9 µs a row). The rules are frozen:
# hashable, `tables.rowload` keeps their models by them. `_Ref` and `_Row` list their
# fields in the models' order, the order a Tickwheel writes them: msgspec looks for each
# key where the last one was found (~0.05 µs less a row's decode).
class _Ref(msgspec.Struct, forbid_unknown_fields=True, gc=False, kw_only=True):
    context: _Name
    aggregate: _Name
    tenant: _Text200 = "(0)"
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]


class _Once(
    msgspec.Struct, tag_field="kind", tag="once", forbid_unknown_fields=True, gc=False, frozen=True
):
    at: _Instant
    coalesce: bool = True
    jitter: _Jitter | None = None


class _Interval(
    msgspec.Struct,
    tag_field="kind",
    tag="interval",
    forbid_unknown_fields=True,
    gc=False,
    frozen=True,
):
    start: _Instant
    every: Annotated[int, msgspec.Meta(gt=0, le=MAX_INT64)]
    coalesce: bool = True
    jitter: _Jitter | None = None
    until: _Instant | None = None
    count: _Count | None = None


class _Cron(
    msgspec.Struct, tag_field="kind", tag="cron", forbid_unknown_fields=True, gc=False, frozen=True
):
    expr: _Text200
    zone: str = "UTC"
    start: _Instant = 0
    coalesce: bool = True
    jitter: _Jitter | None = None
    until: _Instant | None = None
    count: _Count | None = None


class _Command(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: _Text200
    body: msgspec.Raw = msgspec.Raw(b"{}")


_Status = Literal["PENDING", "FIRING", "FIRED", "CANCELLED", "PARKED", "PAUSED"]
_Outcome = Literal[
    "COMMITTED", "DUPLICATE", "UNCHANGED", "REJECTED", "SENT", "EXPIRED", "SKIPPED",
    "CANCELLED", "FAILED", "BUSY",
]  # fmt: skip


class _Row(msgspec.Struct, forbid_unknown_fields=True, gc=False, kw_only=True):
    id: _Text200
    owner: _Ref
    key: _Text200
    version: _Int64
    partition: Annotated[int, msgspec.Meta(ge=0, le=65_535)]
    status: _Status = "PENDING"
    rule: msgspec.Raw  # checked once per distinct bytes (`_rule_bytes_ok`)
    target: _Ref
    command: msgspec.Raw  # likewise (`_command_ok`)
    slot: _Int64 = 0
    slot_due_at: _Instant
    due_at: _Int64
    attempts: _Int64 = 0
    skipped: _Int64 = 0
    outcome: _Outcome | None = None
    error_code: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | None = None
    error_text: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ERROR_TEXT)] | None = None
    parked_when_paused: bool = False
    retry_until: _Int64 | None = None
    cancel_id: _Text200 | None = None


_decode = msgspec.json.Decoder(_Row).decode
_decode_rule = msgspec.json.Decoder(_Once | _Interval | _Cron).decode
_decode_command = msgspec.json.Decoder(_Command).decode
# msgspec's decoders recurse to Python's recursion limit: JSON nested ~1,000 deep raises
# RecursionError (pydantic refuses it with a ValueError, so such a row is no row).
_UNDECODED = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError)


@functools.lru_cache(maxsize=4096)
def _name_ok(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def _key_ends(context: str, aggregate: str, tenant: str, key: str) -> tuple[bytes, bytes] | None:
    """A row key's bytes (`row_key`) before its owner's id (`ref_parts` without it) and
    after it (the key's name), of an owner whose names `AggregateRef` takes; None if a
    name is not one it takes."""
    if not (_name_ok(context) and _name_ok(aggregate)):
        return None
    name = key.encode()
    return ref_parts(context, aggregate, tenant, "")[:-2], len(name).to_bytes(2, "big") + name


@functools.lru_cache(maxsize=4096)
def _body_ok(raw: bytes) -> bool:
    """Whether a body's bytes are a JSON object a stored `CommandSpec` takes
    (`tables.bounds.check_stored`: a row is stored, maybe by 0.2.0, which bounded no
    body), once per distinct body.

    Parsed by pydantic's own parser: orjson reads an integer past 64 bits as a float."""
    try:
        body = from_json(raw)
        check_stored(body)
    except ValueError:
        return False
    return isinstance(body, dict)


@functools.lru_cache(maxsize=1024)
def _zone_ok(zone: str) -> bool:
    try:
        tz_zone(zone)
    except UnknownZone:
        return False
    return True


def _ends_ok(rule: _Interval | _Cron) -> bool:
    """The rules' own checks of `until` and `jitter` (`tables.rules`)."""
    if rule.until is not None and rule.until < rule.start:
        return False
    return not (type(rule) is _Interval and rule.jitter is not None and rule.jitter > rule.every)


def _rule_ok(rule: _Once | _Interval | _Cron) -> bool:
    """The rules' own checks (`tables.rules`) of a rule msgspec took."""
    return isinstance(rule, _Once) or (
        _ends_ok(rule)
        and (type(rule) is not _Cron or (_cron_error(rule.expr) is None and _zone_ok(rule.zone)))
    )


def _rule_bytes_ok(raw: bytes) -> bool:
    """Whether a rule's JSON is one msgspec and the rules' own checks take."""
    try:
        return _rule_ok(_decode_rule(raw))
    except _UNDECODED:
        return False


def _command_ok(raw: bytes) -> bool:
    """Whether a command's JSON is one msgspec takes, its body a stored one (`_body_ok`)."""
    try:
        command = _decode_command(raw)
    except _UNDECODED:
        return False
    body = command.body
    return body == _EMPTY or _body_ok(bytes(body))


_MISS: Any = object()
_CACHE_SIZE = 4096
# The checks' verdicts a restore looks up for every row, by owner and key names and by the bytes
# of its rule and command (a type's timers repeat a few: their structs are never built
# for a hit): plain dicts (a hit is a third of an `lru_cache` call's cost), emptied when
# full.
_KEY_ENDS: dict[tuple[str, str, str, str], tuple[bytes, bytes] | None] = {}
_COMMANDS: dict[bytes, bool] = {}
_RULES: dict[bytes, bool] = {}


_last: list[msgspec.Raw | None] = [None, None]
"""The command and the rule of the last row `restored_index_as_is` took: bytes its checks
took, so that a row's equal to them needs no lookup (only ever set to such bytes)."""
_u64 = struct.Struct(">Q").pack


def _kept(cache: dict[Any, Any], key: Any, value: _V) -> _V:
    """`value`, kept in `cache` under `key`."""
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value
    return value


def restored_index_as_is(
    partition: int, key: bytes, value: bytes, owners: TableOwners | None = None
) -> bytes | None:
    """`restored_index` of a row msgspec and the checks above take as it is (its bytes
    are stored): the restore's common row, in one Python call; None: `restored_model_index`
    decides (a row that is no row of `partition`'s, or one only pydantic's lax mode takes)."""
    try:
        row = _decode(value)
        owner = row.owner
        # The owner check (`TableOwners.refusal`), inlined: two compares, and for a row
        # not finished murmur2 of the id unless it is among the last ids hashed.
        if owners is not None and (
            owner.context != owners.context
            or owner.aggregate != owners.aggregate
            or (
                row.status != "FIRED"  # not ACTIVE: never fires again (`refusal`)
                and row.status != "CANCELLED"
                and id_hash(owner.id) % owners.partitions != partition
            )
        ):
            return None
        # Its own key (`row_key`): the owner's prefix and the key's name, once per
        # distinct four names (they repeat across a type's timers), around the owner's id.
        names = (owner.context, owner.aggregate, owner.tenant, row.key)
        ends = _KEY_ENDS.get(names, _MISS)
        if ends is _MISS:
            ends = _kept(_KEY_ENDS, names, _key_ends(*names))
        if ends is None or row.partition != partition:
            return None
        i = owner.id.encode()
        if key != ends[0] + len(i).to_bytes(2, "big") + i + ends[1]:
            return None
        target = row.target
        if target != owner and not (_name_ok(target.context) and _name_ok(target.aggregate)):
            return None
        # A command and a rule equal to the last ones taken (a restore's rows of a type
        # write them alike) are taken by one compare of their bytes, no copy nor lookup.
        command = row.command
        if command != _last[0]:
            raw = bytes(command)
            ok = _COMMANDS.get(raw)
            if not (ok or (ok is None and _kept(_COMMANDS, raw, _command_ok(raw)))):
                return None
            _last[0] = msgspec.Raw(raw)  # a copy: a caller's buffer may change
        rule = row.rule
        if rule != _last[1]:
            raw = bytes(rule)
            ok = _RULES.get(raw)
            if not (ok or (ok is None and _kept(_RULES, raw, _rule_bytes_ok(raw)))):
                return None
            _last[1] = msgspec.Raw(raw)
        status = row.status
        if (status == "PENDING" or status == "FIRING") and "\x00" not in row.id:
            # `order_key` inlined (the common row, an id without NUL to escape): due_at is
            # within 0..2^63-1, decoded so.
            return DUE + _u64(row.due_at) + row.id.encode() + b"\x00\x00" + key
        return _index(row, key)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):  # see _UNDECODED
        return None
    except (UnicodeEncodeError, OverflowError):  # a lone surrogate; an int past 64 bits
        return None


_fast_index = restored_index_as_is
"""The name `tests/unit/test_rowcheck.py` knows it by."""


_EMPTY = msgspec.Raw(b"{}")


def _index(row: _Row, key: bytes) -> bytes:
    """`tables.keys.index_key` of the row (the same bytes)."""
    status = row.status
    if status == "PENDING" or status == "FIRING":
        return DUE + order_key(row.due_at, row.id) + key
    if status == "PAUSED":
        return HELD + key
    if status == "PARKED":
        t = row.target
        target = ref_parts(t.context, t.aggregate, t.tenant, t.id)
        return PARKED + target + order_key(row.due_at, row.id) + key
    return FINISHED + order_key(finished_at(row.due_at, row.slot_due_at), row.id) + key


def restored_index(
    partition: int, key: bytes, value: bytes, owners: TableOwners | None = None
) -> tuple[bytes, bytes]:
    """The index entry of a changelog row a restore takes (see `tables.keys.index_key`),
    and the bytes to store; `ValueError` with the reason if it is no whole, valid row of
    `partition` stored under its own row key, of an owner `owners` puts there: exactly
    `restored_row`'s verdict."""
    index = restored_index_as_is(partition, key, value, owners)
    if index is not None:
        return index, value
    return restored_model_index(partition, key, value, owners)


def restored_model_index(
    partition: int, key: bytes, value: bytes, owners: TableOwners | None = None
) -> tuple[bytes, bytes]:
    """`restored_index` decided by pydantic (`restored_row`), for a row
    `restored_index_as_is` did not take.

    A row only pydantic's lax mode takes (`"version": "3"`) is stored as the Timer's own
    JSON, so that reads, which trust the store's rows (`tables.rowload.load_timer`), find
    every field of its type."""
    timer = restored_row(partition, key, value, owners)
    return index_key(timer, key), encode_timer(timer)
