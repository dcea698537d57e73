"""The Timers reads built last, by their index entry's key with the bytes they came from
(`load_at`): a fired timer's row is built when its round takes it from the due index
(`DueRow`), then read again in its cycle, when it checks the row is still as loaded
(`find`) and when it settles it against that (`_load_as_loaded`): each read built it
again from the same bytes (#20).

A row is given back only for the very bytes it was built from, so what a read returns is
what `load_timer` makes of the bytes read, whatever wrote them since: Timers are frozen,
and a body is never changed in place (`tables.rowload` shares rules and commands alike).
Bounded: the oldest entry goes when full. Used by the store's reads on the event loop's
thread only (a dict shared by every store of the process: the bytes decide, not the store).
"""

from __future__ import annotations

from tables.rowload import load_timer
from tables.timer import Timer

__all__ = ["LIMIT", "forget", "load_at"]

LIMIT = 16_384
"""How many rows are kept: those a node's rounds built (`DueRow`) and its cycles read next
to fire them (a round takes at most `batch_limit`, 1,000, of each of a node's partitions,
all before their cycles run). A row written over is forgotten (`forget`), so what is kept
is mostly rows in flight, alive in the runner meanwhile."""

_ROWS: dict[bytes, tuple[bytes, Timer]] = {}


def load_at(key: bytes, value: bytes, partition: int, where: object = None) -> Timer:
    """`load_timer(value, where, partition)` (`where`: `key` when None), the Timer built
    last from these bytes at `key` when there is one."""
    held = _ROWS.get(key)
    if held is not None and held[0] == value:
        return held[1]
    timer = load_timer(value, key if where is None else where, partition)
    if held is None and len(_ROWS) >= LIMIT:
        del _ROWS[next(iter(_ROWS))]
    _ROWS[key] = (value, timer)
    return timer


def forget(key: bytes) -> None:
    """The row at index entry `key` was written over or deleted: not kept any more."""
    _ROWS.pop(key, None)
