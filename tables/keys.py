"""The TimerStore's bytes: row keys, index keys and row values.

Every key a partition's DB holds starts with one byte that says what it is:

- ``r`` + row key → the row. The row key is the length-prefixed UTF-8 of
  ``(context, aggregate, tenant, id, key)``, so an owner's rows share a byte prefix
  (``cancel_all`` is a prefix scan) and no owner's prefix is another's.
- ``d`` + due_at (8 bytes, big-endian) + id (escaped, terminated) + row key → the row,
  for PENDING and FIRING rows only: iterating it runs in ``(due_at, id)`` order.
- ``p`` + target + due_at + id + row key → the row, for PARKED rows only.
- ``f`` + finished_at + id + row key → the row, for FIRED and CANCELLED rows only
  (`finished_at`): the retention sweep finds expired rows with one range scan.
- ``h`` + row key → the row, for PAUSED rows only: held, in no index any scan of the
  firing loop, the retention sweep or the census reads (a store without paused timers
  has no such key, so an older store reads as before).

A row is stored once: in its index entry (the ``r`` entry then holds just that index key,
which starts with ``d``, ``p``, ``f`` or ``h``), else under ``r`` (its JSON starts with ``{``;
no row of this format has none). So a restore writes each pending timer's bytes once, and learns a
row's old index entry from its ``r`` entry without decoding it.
- ``\\x00`` + name → the store's own bookkeeping (the changelog offset); no scan reaches it.

The id is escaped (``\\x00`` → ``\\x00\\x01``) and terminated by ``\\x00\\x00`` so that byte
order is the ids' code-point order (Python's ``str`` order) whatever they contain.
Values are the Timer's JSON dict (the bytes orjson writes of ``model_dump(mode="json")``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel

from tables.refs import AggregateRef
from tables.rules import CronRule, IntervalRule, OnceRule
from tables.timer import CommandSpec, Outcome, Timer, TimerStatus

_M = TypeVar("_M", bound=BaseModel)

__all__ = [
    "DUE",
    "FINISHED",
    "HELD",
    "OFFSET_KEY",
    "PARKED",
    "ROW",
    "decode_timer",
    "due_key",
    "due_key_order",
    "due_key_prefix",
    "due_upper_bound",
    "encode_timer",
    "finished_at",
    "finished_upper_bound",
    "index_key",
    "index_key_of",
    "load_timer",
    "order_key",
    "owner_prefix",
    "parked_key",
    "parked_prefix",
    "ref_bytes",
    "ref_bytes_of",
    "ref_parts",
    "restored_row",
    "row_key",
    "row_key_of",
]

ROW = b"r"
DUE = b"d"
PARKED = b"p"
FINISHED = b"f"
HELD = b"h"
OFFSET_KEY = b"\x00changelog-offset"

_MAX_U64 = (1 << 64) - 1


def _fields(*texts: str) -> bytes:
    """Each text as its UTF-8 length (2 bytes, big-endian) and bytes: a prefix-free join.

    No field of a valid Timer comes near 65,535 bytes; a longer one is an
    `OverflowError`.
    """
    parts = []
    for text in texts:
        raw = text.encode()
        parts.append(len(raw).to_bytes(2, "big"))
        parts.append(raw)
    return b"".join(parts)


def _ref(context: str, aggregate: str, tenant: str, id: str) -> bytes:
    # Unrolled `_fields`: this runs once per row on every write and restore.
    c, a, t, i = context.encode(), aggregate.encode(), tenant.encode(), id.encode()
    return b"".join(
        (
            len(c).to_bytes(2, "big"), c,
            len(a).to_bytes(2, "big"), a,
            len(t).to_bytes(2, "big"), t,
            len(i).to_bytes(2, "big"), i,
        )
    )  # fmt: skip


def ref_parts(context: str, aggregate: str, tenant: str, id: str) -> bytes:
    """`ref_bytes` of an aggregate given as its four fields."""
    return _ref(context, aggregate, tenant, id)


def ref_bytes(ref: AggregateRef) -> bytes:
    """An aggregate's four fields, each length-prefixed: prefix-free, compared field by field."""
    return _ref(ref.context, ref.aggregate, ref.tenant, ref.id)


def owner_prefix(owner: AggregateRef) -> bytes:
    """The bytes every row key of `owner` starts with."""
    return ref_bytes(owner)


def row_key(owner: AggregateRef, key: str) -> bytes:
    """The key of the row `(owner, key)`: also its changelog record's key."""
    return _ref(owner.context, owner.aggregate, owner.tenant, owner.id) + _fields(key)


def ref_bytes_of(ref: dict[str, Any]) -> bytes:
    """`ref_bytes` of an aggregate in its JSON dict form (as a changelog value decodes)."""
    return _ref(ref["context"], ref["aggregate"], ref["tenant"], ref["id"])


def row_key_of(row: dict[str, Any]) -> bytes:
    """`row_key` of a row in its JSON dict form."""
    owner = row["owner"]
    key: bytes = row["key"].encode()
    return (
        _ref(owner["context"], owner["aggregate"], owner["tenant"], owner["id"])
        + len(key).to_bytes(2, "big")
        + key
    )


def order_key(due_at: int, timer_id: str) -> bytes:
    """`(due_at, id)` as bytes that sort as the pair does."""
    if not 0 <= due_at <= _MAX_U64:
        raise ValueError(f"due_at out of range: {due_at}")
    return due_at.to_bytes(8, "big") + timer_id.encode().replace(b"\x00", b"\x00\x01") + b"\x00\x00"


def due_key(due_at: int, timer_id: str, row: bytes) -> bytes:
    return DUE + order_key(due_at, timer_id) + row


def due_key_order(key: bytes) -> tuple[int, str]:
    """`(due_at, id)` of a due-index key, read back without its row (see `due_key`)."""
    end = key.index(b"\x00\x00", 9)  # an escaped id holds no two NULs in a row
    return int.from_bytes(key[1:9], "big"), key[9:end].replace(b"\x00\x01", b"\x00").decode()


def due_key_prefix(due_at: int) -> bytes:
    """The first due-index key of an entry due at `due_at`."""
    return DUE + due_at.to_bytes(8, "big")


def due_upper_bound(until: int) -> bytes:
    """The first due-index key past every entry due at or before `until` (exclusive bound)."""
    if until >= _MAX_U64:
        return bytes([DUE[0] + 1])
    return DUE + (until + 1).to_bytes(8, "big")


def finished_upper_bound(until: int) -> bytes:
    """The first finished-index key past every entry finished at or before `until`."""
    if until >= _MAX_U64:
        return bytes([FINISHED[0] + 1])
    return FINISHED + (max(until, -1) + 1).to_bytes(8, "big")


def parked_prefix(target: AggregateRef) -> bytes:
    return PARKED + ref_bytes(target)


def parked_key(target: bytes, due_at: int, timer_id: str, row: bytes) -> bytes:
    """`target` is `ref_bytes` of the parked timer's target."""
    return PARKED + target + order_key(due_at, timer_id) + row


# --- values ---------------------------------------------------------------------------


def encode_timer(timer: Timer) -> bytes:
    """The row's value: the Timer's JSON dict, byte for byte what orjson writes of it."""
    return timer.__pydantic_serializer__.to_json(timer)


_validate_json = Timer.__pydantic_validator__.validate_json


def decode_timer(raw: bytes) -> Timer:
    """A row's value back into its Timer; `pydantic.ValidationError` if it is not one.

    pydantic-core's JSON validation builds the five models about as fast as orjson plus
    unvalidated construction in Python does (measured ~8.5 µs a row either way on the
    2-core box), so reads validate for free; calling the validator directly skips
    `model_validate_json`'s wrapper (~10 %).
    """
    timer: Timer = _validate_json(raw)
    return timer


_set = object.__setattr__
_RULE_CLASSES: tuple[type[BaseModel], ...] = (OnceRule, IntervalRule, CronRule)
# A rule's optional fields left out of its JSON while unset (`until`, `count`, `jitter`:
# `exclude_if`), put back at their defaults so the model `load_timer` makes has each field.
_OMITTED: dict[type[BaseModel], dict[str, Any]] = {
    cls: {
        name: field.default
        for name, field in cls.model_fields.items()
        if field.default is None and not field.is_required()
    }
    for cls in _RULE_CLASSES
}
# A timer's optional fields left out while unset (`error_code`, `error_text`), likewise.
_OMITTED[Timer] = {
    name: None
    for name, field in Timer.model_fields.items()
    if field.default is None and field.exclude_if is not None
}
_TIMER_FIELDS = len(Timer.model_fields)
if list(Timer.model_fields)[-2:] != list(_OMITTED[Timer]) or len(_OMITTED[Timer]) != 2:
    raise TypeError("load_timer expects error_code and error_text as Timer's last fields")
_RULES: dict[str, tuple[type[BaseModel], int]] = {
    cls.model_fields["kind"].default: (cls, len(cls.model_fields)) for cls in _RULE_CLASSES
}
_STATUSES = {status.value: status for status in TimerStatus}
_OUTCOMES: dict[str | None, Outcome | None] = {outcome.value: outcome for outcome in Outcome}
_OUTCOMES[None] = None
# One set of field names a model class, shared by the instances `load_timer` makes: every
# row names every field, and a frozen model never changes its set (`model_copy` changes a
# copy: a frozenset would not do, its copy is itself).
_ALL_SET: dict[type[BaseModel], set[str]] = {
    cls: set(cls.model_fields) for cls in (Timer, AggregateRef, CommandSpec)
}
_ALL_SET.update((cls, set(cls.model_fields)) for cls, _ in _RULES.values())
_NO_ERROR_SET = _ALL_SET[Timer] - set(_OMITTED[Timer])


def _made(cls: type[_M], values: dict[str, Any], named: set[str] | None = None) -> _M:
    """`cls.model_construct(**values)` without its per-field loop: `values` names every
    field (pydantic's own construction sets these four attributes); `named`: the fields
    counted as set (all of them unless given)."""
    made = cls.__new__(cls)
    _set(made, "__dict__", values)
    _set(made, "__pydantic_fields_set__", _ALL_SET[cls] if named is None else named)
    _set(made, "__pydantic_extra__", None)
    _set(made, "__pydantic_private__", None)
    return made


def _with_omitted(cls: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a rule's or a timer's) with its omitted optional fields at their defaults,
    in the model's field order (the order its serializer writes a dict built this way back
    in); `values` itself when it lacks anything else (then `load_timer` decodes the row in
    full)."""
    omitted = _OMITTED[cls]
    if not all(name in values or name in omitted for name in _FIELD_NAMES[cls]):
        return values
    return {name: values[name] if name in values else omitted[name] for name in _FIELD_NAMES[cls]}


_MODELS: tuple[type[BaseModel], ...] = (*_RULE_CLASSES, Timer)
_FIELD_NAMES = {cls: tuple(cls.model_fields) for cls in _MODELS}
_ABSENT = object()
"""A required field no row named (`_RULE_FORMS`): such a rule is decoded in full."""
# Per rule kind: its class, its field count and a dict of its fields in the model's order,
# each at its default if it may be left out, else at `_ABSENT`. A copy updated with a row's
# rule has every field in that order (a dict keeps its keys' first places): one C-level
# copy and update where `_with_omitted` loops in Python (~3 µs of the ~12 a row took).
_RULE_FORMS: dict[str, tuple[type[BaseModel], int, dict[str, Any]]] = {
    cls.model_fields["kind"].default: (
        cls,
        len(cls.model_fields),
        {name: _OMITTED[cls].get(name, _ABSENT) for name in cls.model_fields},
    )
    for cls in _RULE_CLASSES
}
_new = object.__new__


def _model(
    cls: type[_M], values: dict[str, Any], named: set[str], new: Any = _new, set_: Any = _set
) -> _M:
    """`_made` for `load_timer`'s hot loop: `named` given, names bound as defaults."""
    made = new(cls)
    set_(made, "__dict__", values)
    set_(made, "__pydantic_fields_set__", named)
    set_(made, "__pydantic_extra__", None)
    set_(made, "__pydantic_private__", None)
    return made  # type: ignore[no-any-return]


_REF_SET, _COMMAND_SET = _ALL_SET[AggregateRef], _ALL_SET[CommandSpec]
_RULE_CACHE: dict[tuple[tuple[str, Any], ...], BaseModel] = {}
"""The rules `load_timer` made, by their JSON's items; emptied when full."""
_RULE_CACHE_SIZE = 4096


def load_timer(raw: bytes) -> Timer:
    """A row's value as the store wrote it back into its Timer, without validating it again.

    Only for the store's own rows: each was validated on its way in (`restored_row`, or a
    Timer the store wrote), and reads do not pay for it twice (`decode_timer` builds a
    Timer in ~10 µs on the 2-core box, this in about half, sharing the owner as target when
    they are equal). A row that leaves out optional fields unset (`exclude_if`: a rule's
    `until`, `count`, `jitter`, a timer's `error_code`, `error_text`) gets them at their
    defaults; one that does not name every other field (written by another version) is
    decoded in full.
    """
    row = orjson.loads(raw)
    owner, target, rule, command = row["owner"], row["target"], row["rule"], row["command"]
    form = _RULE_FORMS.get(rule.get("kind", ""))
    if form is None:
        return decode_timer(raw)
    cls, size, template = form
    # Rules repeat across a type's timers (their fields are all scalars) and are frozen:
    # the rows share one instance a distinct rule.
    shared = (rule_key := tuple(rule.items())) in _RULE_CACHE
    if shared:
        made_rule = _RULE_CACHE[rule_key]
    elif len(rule) < size:
        full = template.copy()
        full.update(rule)
        if len(full) == size and _ABSENT not in full.values():
            rule = full
    # As `decode_timer` would, a row's set fields are the ones its JSON names.
    named = _ALL_SET[Timer]
    if len(row) < _TIMER_FIELDS:
        if len(row) == _TIMER_FIELDS - 2 and "error_code" not in row and "error_text" not in row:
            # The usual row, with no error: both fields are the model's last, so appended
            # they keep the model's field order (cheaper than `_with_omitted`'s new dict).
            row["error_code"] = row["error_text"] = None
            named = _NO_ERROR_SET
        else:
            named = set(row)
            row = _with_omitted(Timer, row)
    if (
        len(row) != _TIMER_FIELDS
        or (not shared and len(rule) != size)
        or len(owner) != 4
        or len(target) != 4
        or len(command) != 2
    ):
        return decode_timer(raw)
    row["owner"] = owner = _model(AggregateRef, owner, _REF_SET)
    row["target"] = owner if target == owner.__dict__ else _model(AggregateRef, target, _REF_SET)
    if not shared:
        made_rule = _model(cls, rule, _ALL_SET[cls])
        if len(_RULE_CACHE) >= _RULE_CACHE_SIZE:
            _RULE_CACHE.clear()
        _RULE_CACHE[rule_key] = made_rule
    row["rule"] = made_rule
    row["command"] = _model(CommandSpec, command, _COMMAND_SET)
    row["status"] = _STATUSES[row["status"]]
    row["outcome"] = _OUTCOMES[row["outcome"]]
    return _model(Timer, row, named)


def restored_row(partition: int, key: bytes, value: bytes) -> Timer:
    """A changelog value as a restore takes it: a whole, valid Timer (within every bound) of
    `partition`, stored under its own row key; `ValueError` with the reason otherwise."""
    timer = decode_timer(value)  # a pydantic ValidationError is a ValueError
    if row_key(timer.owner, timer.key) != key:
        raise ValueError(f"it holds the timer ({timer.owner}, {timer.key!r}) under another key")
    if timer.partition != partition:
        raise ValueError(f"it is a timer of partition {timer.partition}")
    return timer


_INDEXED_DUE = frozenset({"PENDING", "FIRING"})


def finished_at(due_at: int, slot_due_at: int) -> int:
    """When a FIRED or CANCELLED row counts as finished, for its retention: the later of
    the times it names. A FIRED row's `due_at` is its last claim's deadline (just after it
    fired); a cancelled one keeps the due time it had, so a timer cancelled long before it
    was due is kept until then (a replay of its schedule up to that time still finds it)."""
    return max(due_at, slot_due_at)


def index_key(timer: Timer, row: bytes) -> bytes:
    """The one index entry a row has: due (PENDING, FIRING), parked (PARKED), held (PAUSED)
    or finished (FIRED, CANCELLED)."""
    if timer.status in _INDEXED_DUE:
        return due_key(timer.due_at, timer.id, row)
    if timer.status == "PAUSED":
        return HELD + row
    if timer.status == "PARKED":
        return parked_key(ref_bytes(timer.target), timer.due_at, timer.id, row)
    return FINISHED + order_key(finished_at(timer.due_at, timer.slot_due_at), timer.id) + row


def index_key_of(value: dict[str, Any], row: bytes) -> bytes:
    """`index_key` of a row in its JSON dict form."""
    status = value["status"]
    if status in _INDEXED_DUE:
        return due_key(value["due_at"], value["id"], row)
    if status == "PAUSED":
        return HELD + row
    if status == "PARKED":
        return parked_key(ref_bytes_of(value["target"]), value["due_at"], value["id"], row)
    order = order_key(finished_at(value["due_at"], value["slot_due_at"]), value["id"])
    return FINISHED + order + row
