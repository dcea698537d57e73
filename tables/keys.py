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

from typing import Any

from tables.owners import TableOwners
from tables.refs import AggregateRef
from tables.timer import ACTIVE, Timer

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
    "key_suffix",
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


def key_suffix(key: str) -> bytes:
    """What `row_key` holds after its owner's prefix (`owner_prefix`): `row_key(owner, key)`
    is `owner_prefix(owner) + key_suffix(key)`."""
    return _fields(key)


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
    """The first due-index key of an entry due at `due_at`; past 2^64-1 (no entry is due
    so late: a census looks past a `now` that large), the first key past them all."""
    if due_at > _MAX_U64:
        return bytes([DUE[0] + 1])
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

    Validates in full (~10 µs a row on the 2-core box): reads take the cheaper
    `tables.rowload.load_timer`, which falls back to this. Calling the validator directly
    skips `model_validate_json`'s wrapper (~10 %).
    """
    timer: Timer = _validate_json(raw)
    return timer


def restored_row(
    partition: int, key: bytes, value: bytes, owners: TableOwners | None = None
) -> Timer:
    """A changelog value as a restore takes it: a whole, valid Timer (within every bound) of
    `partition`, stored under its own row key, of an owner `owners` puts in `partition`
    (unchecked without them: a store of made-up rows); `ValueError` with the reason
    otherwise."""
    timer = decode_timer(value)  # a pydantic ValidationError is a ValueError
    if row_key(timer.owner, timer.key) != key:
        raise ValueError(f"it holds the timer ({timer.owner}, {timer.key!r}) under another key")
    if timer.partition != partition:
        raise ValueError(f"it is a timer of partition {timer.partition}")
    live = timer.status in ACTIVE
    if owners is not None and (why := owners.refusal(timer.owner, partition, live=live)):
        raise ValueError(why)
    return timer


_INDEXED_DUE = frozenset({"PENDING", "FIRING"})


def finished_at(due_at: int, slot_due_at: int) -> int:
    """When a FIRED or CANCELLED row counts as finished, for its retention: the later of
    the times it names. A FIRED row's `due_at` is its last claim's deadline (just after it
    fired); a cancelled one keeps the due time it had, or takes the time its cancel was
    read if that is later (`tables.writes.cancel_row`), so a timer cancelled long before it
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
