"""The Timers reads built last, by their index entry's key with the bytes they came from
(`load_at`): a fired timer's row is built when its round takes it from the due index
(`DueRow`), then read again in its cycle, when it checks the row is still as loaded
(`find`) and when it settles it against that (`_load_as_loaded`): each read built it
again from the same bytes (#20).

A row is given back only for the very bytes it was built from, so what a read returns is
what `load_timer` makes of the bytes read, whatever wrote them since: Timers are frozen,
and a body is never changed in place (`tables.rowload` shares rules and commands alike).
Bounded in rows and in bytes: the oldest entries go when full. Used by the store's reads
on the event loop's thread only (one map for every store of the process: the bytes
decide, not the store).
"""

from __future__ import annotations

from collections import OrderedDict

from tables.rowload import load_timer
from tables.timer import Timer

__all__ = ["LIMIT", "LIMIT_BYTES", "forget", "load_at"]

LIMIT = 16_384
"""How many rows are kept: those a node's rounds built (`DueRow`) and its cycles read next
to fire them (a round takes at most `batch_limit`, 1,000, of each of a node's partitions,
all before their cycles run). A row written over is forgotten (`forget`), so what is kept
is mostly rows in flight, alive in the runner meanwhile."""

LIMIT_BYTES = 32 << 20
"""How many bytes of rows are kept at most: rows may be up to `max_record_bytes` (1 MiB) each,
and a Timer built from one weighs a few times its bytes."""

# An OrderedDict: a plain dict's oldest entry, taken by `next(iter(...))` after many
# deletions at its front, walks over their empty slots (up to ~1 ms once full).
_ROWS: OrderedDict[bytes, tuple[bytes, Timer]] = OrderedDict()
_held_bytes = 0


def load_at(key: bytes, value: bytes, partition: int, where: object = None) -> Timer:
    """`load_timer(value, where, partition)` (`where`: `key` when None), the Timer built
    last from these bytes at `key` when there is one."""
    held = _ROWS.get(key)
    if held is not None and held[0] == value:
        return held[1]
    timer = load_timer(value, key if where is None else where, partition)
    global _held_bytes
    if held is not None:
        _held_bytes -= len(held[0])
    _held_bytes += len(value)
    _ROWS[key] = (value, timer)
    while len(_ROWS) > LIMIT or _held_bytes > LIMIT_BYTES:
        _held_bytes -= len(_ROWS.popitem(last=False)[1][0])
    return timer


def forget(key: bytes) -> None:
    """The row at index entry `key` was written over or deleted: not kept any more."""
    global _held_bytes
    held = _ROWS.pop(key, None)
    if held is not None:
        _held_bytes -= len(held[0])
