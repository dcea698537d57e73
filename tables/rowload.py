"""A stored row back into its Timer (`load_timer`): how every RocksDB read builds one.

The store's rows were validated on their way in (a put's Timer, or a restore's check,
`tables.rowcheck`), so a read does not pay pydantic's validation of five models again
(~10 µs a row on the 2-core box). msgspec decodes the row into structs checked in C against
the same types and bounds (about as fast as orjson into unchecked dicts), and the
models are made around their fields without validation (`model_construct` without its
per-field loop). What msgspec cannot express (an aggregate name's pattern, a body's
stored bounds, `tables.bounds.check_stored`, a rule's cron expression, zone and ends) is
checked once per distinct value: they repeat across a type's timers. So a row loads as
exactly the Timer pydantic would make of it, or not at all: one msgspec refuses (written by another
version, leaning on defaults) is decoded in full by pydantic, and one pydantic refuses
too is a `StoreError` naming its key, never a half-built Timer
(`tests/unit/test_rowload.py` holds this over mangled rows).

A row's rule and command are kept as raw JSON and their models cached by those bytes:
rules (frozen, scalar fields) and commands (frozen; a body is never changed in place)
are shared by the rows that write them alike, as `model_copy` already shares them, and
a row decodes and checks neither again. Measured in one process over the same 1,000
rows of 1 M (bench.store_bench's store), `due()`'s CPU p50 went 7.2-8.1 -> 5.3-5.9 ms.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType
from pydantic import BaseModel
from pydantic_core import from_json

from tables.bounds import StoredObject, check_json, check_stored
from tables.exceptions import StoreError
from tables.keys import decode_timer
from tables.refs import AggregateRef
from tables.rowcheck import (
    _Cron,
    _ends_ok,
    _Instant,
    _Int64,
    _Interval,
    _Name,
    _name_ok,
    _Once,
    _Text200,
    _zone_ok,
)
from tables.rules import CronRule, IntervalRule, OnceRule, _cron_error
from tables.timer import MAX_ERROR_TEXT, CommandSpec, Outcome, Timer, TimerStatus

__all__ = ["load_timer", "load_timers"]


# Structs that refuse unknown fields (a TypedDict would drop them where pydantic refuses
# the row), fields in the models' order: `asdict` makes the dict a model holds.
class _Ref(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    context: _Name
    aggregate: _Name
    tenant: _Text200
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]


class _Command(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: _Text200
    body: msgspec.Raw = msgspec.Raw(b"{}")


class _Row(msgspec.Struct, forbid_unknown_fields=True, gc=False, kw_only=True):
    """A Timer's JSON as `encode_timer` writes it: every field, but the five left out while
    unset (UNSET: an explicit null is refused, as no row of this store holds one)."""

    id: _Text200
    owner: _Ref
    key: _Text200
    version: _Int64
    partition: Annotated[int, msgspec.Meta(ge=0, le=65_535)]
    status: TimerStatus
    rule: msgspec.Raw  # its model kept by its bytes (`_rule`): rows repeat a few rules
    target: _Ref
    command: msgspec.Raw  # likewise (`_command`)
    slot: _Int64
    slot_due_at: _Instant
    due_at: _Int64
    attempts: _Int64
    skipped: _Int64
    outcome: Outcome | None
    error_code: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | UnsetType = UNSET
    error_text: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ERROR_TEXT)] | UnsetType
    ) = UNSET
    parked_when_paused: bool | UnsetType = UNSET
    retry_until: _Int64 | UnsetType = UNSET
    cancel_id: _Text200 | UnsetType = UNSET


_decode = msgspec.json.Decoder(_Row).decode
_decode_rule = msgspec.json.Decoder(_Once | _Interval | _Cron).decode
_decode_command = msgspec.json.Decoder(_Command).decode
# RecursionError: JSON nested past Python's recursion limit, which msgspec's decoders keep
# (pydantic's `decode_timer` then refuses it with a ValueError).
_REFUSED = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError)
_ERRORS = ("error_code", "error_text")
_FLAG = "parked_when_paused"
_UNTIL = "retry_until"
_CANCEL = "cancel_id"
_asdict = msgspec.structs.asdict
if (
    _Row.__struct_fields__ != tuple(Timer.model_fields)
    or _Row.__struct_fields__[-5:] != (*_ERRORS, _FLAG, _UNTIL, _CANCEL)
    or _Ref.__struct_fields__ != tuple(AggregateRef.model_fields)
):
    raise TypeError("rowload's structs must name the models' fields in order")

_new = object.__new__
_ALL_SET = set(Timer.model_fields)
_USUAL_SET = _ALL_SET - {*_ERRORS, _FLAG, _UNTIL, _CANCEL}
_REF_SET = set(AggregateRef.model_fields)
_COMMAND_SET = set(CommandSpec.model_fields)
_CACHE_SIZE = 4096
"""How many distinct names, rules and commands each cache holds; emptied when full."""
_NAMES: dict[str, bool] = {}
_RULE_CACHE: dict[bytes, BaseModel | None] = {}
"""Each rule's model, by its JSON (None: a rule pydantic refuses)."""
_COMMANDS: dict[bytes, CommandSpec | None] = {}
"""Each command's model, by its JSON (None: a command pydantic refuses)."""


_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def _slot_setters(*models: type[BaseModel]) -> tuple[Any, Any, Any, Any]:
    """The `__set__` of the four slots every pydantic model holds (`__dict__` and the
    three `model_construct` sets), as BaseModel defines them: calling a slot's own
    setter skips `object.__setattr__`'s lookup of the name (~35 ns a slot, eight slots
    a row). `TypeError` if BaseModel holds one no longer, or one of `models` shadows it
    (its setter would then not be the attribute those models' instances have)."""
    setters = []
    for name in _SLOTS:
        slot = vars(BaseModel).get(name)
        setter = getattr(slot, "__set__", None)
        shadowed = [
            model.__name__
            for model in models
            if next((cls for cls in model.__mro__ if name in vars(cls)), None) is not BaseModel
        ]
        if shadowed or setter is None or getattr(slot, "__objclass__", None) is not BaseModel:
            raise TypeError(f"{name} is no slot of BaseModel's that {shadowed or 'pydantic'} keep")
        setters.append(setter)
    return setters[0], setters[1], setters[2], setters[3]


_set_dict, _set_fields, _set_extra, _set_private = _slot_setters(
    Timer, AggregateRef, CommandSpec, OnceRule, IntervalRule, CronRule
)


def _model(cls: Any, values: dict[str, Any], named: set[str]) -> Any:
    """`cls.model_construct(**values)` without its per-field loop: `values` names every
    field (pydantic's own construction sets these four attributes)."""
    made = _new(cls)
    _set_dict(made, values)
    _set_fields(made, named)
    _set_extra(made, None)
    _set_private(made, None)
    return made


def _name(name: str) -> bool:
    """Whether `AggregateRef` takes `name` as a context or aggregate name, kept."""
    ok = _NAMES.get(name)
    if ok is None:
        if len(_NAMES) >= _CACHE_SIZE:
            _NAMES.clear()
        ok = _NAMES[name] = _name_ok(name)
    return ok


_RULE_CLASSES: dict[type[msgspec.Struct], type[BaseModel]] = {
    _Once: OnceRule,
    _Interval: IntervalRule,
    _Cron: CronRule,
}
_OPTIONAL = frozenset({"jitter", "until", "count"})
"""A rule's fields left out of its JSON while unset (`exclude_if`)."""


def _made_rule(rule: _Once | _Interval | _Cron) -> BaseModel | None:
    """The model of a rule msgspec took, if the rules' own checks take it too."""
    if not isinstance(rule, _Once) and (
        not _ends_ok(rule)
        or (type(rule) is _Cron and (_cron_error(rule.expr) is not None or not _zone_ok(rule.zone)))
    ):
        return None
    cls = _RULE_CLASSES[type(rule)]
    values = {
        name: getattr(rule, name) if name != "kind" else cls.model_fields["kind"].default
        for name in cls.model_fields
    }
    named = {name for name, value in values.items() if value is not None or name not in _OPTIONAL}
    made: BaseModel = _model(cls, values, named)
    return made


def _rule(raw: bytes) -> BaseModel | None:
    """The model of a rule's JSON, kept (None: msgspec or the rules' checks refuse it)."""
    made = _RULE_CACHE.get(raw, _new)
    if made is _new:
        if len(_RULE_CACHE) >= _CACHE_SIZE:
            _RULE_CACHE.clear()
        try:
            made = _made_rule(_decode_rule(raw))
        except _REFUSED:
            made = None
        _RULE_CACHE[raw] = made
    return made  # type: ignore[return-value]


def _made_command(type_: str, body: bytes) -> CommandSpec | None:
    # pydantic's own parser: orjson reads an integer past 64 bits as a float. A row is
    # stored (maybe by 0.2.0, which bounded no body): its body is held to `check_stored`,
    # one past the new-input bounds kept as a `StoredObject`, as `Timer` validates it.
    try:
        value = from_json(body)
        if not isinstance(value, dict):
            return None
        try:
            check_json(value)
        except ValueError:
            check_stored(value)
            value = StoredObject(value)
    except ValueError:
        return None
    made: CommandSpec = _model(CommandSpec, {"type": type_, "body": value}, _COMMAND_SET)
    return made


def _command(raw: bytes) -> CommandSpec | None:
    """The model of a command's JSON, kept (None: msgspec refuses it, or its body is no
    stored `CommandSpec`'s)."""
    made = _COMMANDS.get(raw, _new)
    if made is _new:
        if len(_COMMANDS) >= _CACHE_SIZE:
            _COMMANDS.clear()
        try:
            command = _decode_command(raw)
            made = _made_command(command.type, bytes(command.body))
        except _REFUSED:
            made = None
        _COMMANDS[raw] = made
    return made  # type: ignore[return-value]


def _built(
    struct: _Row,
    names: dict[str, bool] = _NAMES,
    rules: dict[bytes, BaseModel | None] = _RULE_CACHE,
    commands: dict[bytes, CommandSpec | None] = _COMMANDS,
    new: Any = _new,
    asdict: Any = _asdict,
    set_dict: Any = _set_dict,
    set_fields: Any = _set_fields,
    set_extra: Any = _set_extra,
    set_private: Any = _set_private,
    timer_class: Any = Timer,
    ref_class: Any = AggregateRef,
    ref_set: set[str] = _REF_SET,
    usual: set[str] = _USUAL_SET,
    unset: Any = UNSET,
) -> Timer | None:
    """The Timer of a row msgspec took, if the cached checks take it too; None leaves
    the row to pydantic.

    Written for speed (it builds each row of a `due()`): names bound as defaults, the
    caches' hits and the models' construction inlined (each slot set by its own
    setter), misses left to functions."""
    owner = struct.owner
    context, aggregate = owner.context, owner.aggregate
    if not (names.get(context) or _name(context)) or not (names.get(aggregate) or _name(aggregate)):
        return None
    rule = rules.get(raw := bytes(struct.rule)) or _rule(raw)
    made = commands.get(raw := bytes(struct.command)) or _command(raw)
    if rule is None or made is None:
        return None
    row = asdict(struct)
    row["rule"], row["command"] = rule, made
    row["owner"] = ref = new(ref_class)
    set_dict(ref, asdict(owner))
    set_fields(ref, ref_set)
    set_extra(ref, None)
    set_private(ref, None)
    target = struct.target
    if target == owner:
        row["target"] = ref
    elif _name(target.context) and _name(target.aggregate):
        row["target"] = _model(AggregateRef, asdict(target), _REF_SET)
    else:
        return None
    named = usual
    if struct.error_code is unset and struct.error_text is unset:
        row["error_code"] = row["error_text"] = None  # the usual row: no error
    else:
        named = _ALL_SET - {name for name in _ERRORS if row[name] is UNSET}
        named -= {_FLAG, _UNTIL, _CANCEL}
        for name in _ERRORS:
            if row[name] is UNSET:
                row[name] = None
    if struct.parked_when_paused is unset:
        row[_FLAG] = False  # the usual row: not a parked timer paused
    else:
        named = named | {_FLAG}
    if struct.retry_until is unset:
        row[_UNTIL] = None  # the usual row: no operator's retry under way
    else:
        named = named | {_UNTIL}
    if struct.cancel_id is unset:
        row[_CANCEL] = None  # the usual row: no cancel at its version before its set
    else:
        named = named | {_CANCEL}
    timer = new(timer_class)
    set_dict(timer, row)
    set_fields(timer, named)
    set_extra(timer, None)
    set_private(timer, None)
    return timer  # type: ignore[no-any-return]


def load_timer(raw: bytes, where: object = None, partition: int | None = None) -> Timer:
    """A row's value as the store wrote it back into its Timer: exactly what
    `decode_timer` makes of it, about twice as fast; `StoreError` naming `where` (the
    row's key, or what holds the row) and its `partition` if it is no Timer."""
    try:
        timer = _built(_decode(raw))
    except _REFUSED:  # (decoding all rows of a due() in one call measured slower)
        timer = None
    if timer is not None:
        return timer
    try:
        return decode_timer(raw)
    except ValueError as exc:  # a pydantic ValidationError is one
        name = "a stored row" if where is None else f"the stored row {where!r}"
        name += "" if partition is None else f" of partition {partition}"
        raise StoreError(f"{name} is no Timer (corrupt?): {exc}", partition=partition) from exc


def load_timers(rows: Iterable[tuple[bytes, bytes, int]]) -> list[Timer]:
    """`load_timer` of each `(key, value, partition)` read from a partition's index, in
    order: a `due()`'s thousand rows in one loop (no call of `load_timer` a row; a row
    the fast path leaves is decided by it, `StoreError` naming its key and partition)."""
    timers: list[Timer] = []
    append, decode, built = timers.append, _decode, _built
    for key, value, partition in rows:
        try:
            timer = built(decode(value))
        except _REFUSED:
            timer = None
        append(load_timer(value, key, partition) if timer is None else timer)
    return timers
