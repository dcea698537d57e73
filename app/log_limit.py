"""Bounds a log line whose rate someone else sets: garbage another writer puts on a topic
this node reads, or a dependency failing on every try. The first occurrence of a kind is
logged in full (its record's place, its traceback); the repeats are counted, and at most
one per interval is logged again, saying how many were not.

The count is told by the next line that passes: nothing runs on a timer here, so a kind
that never comes back keeps its last count untold (its first line was logged in full).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

__all__ = ["DEFAULT_INTERVAL_S", "LogLimit"]

DEFAULT_INTERVAL_S: Final = 60.0
"""At most one line per kind this often."""

_MAX_KINDS: Final = 1_000
# The kind of every one past `max_kinds`: kinds made of what a record says cannot grow the
# table, nor the log, without bound.
_OTHERS: Final = object()


class LogLimit:
    """Per kind: whether an occurrence is logged (`check`). One thread's (an event loop's).

    `clock`: seconds, only ever compared (monotonic by default; a test passes its own).
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_kinds: int = _MAX_KINDS,
    ) -> None:
        self._interval = interval_s
        self._clock = clock
        self._max_kinds = max_kinds
        # Per kind: when a line last passed, and how many were counted since.
        self._kinds: dict[object, tuple[float, int]] = {}

    def check(self, kind: object = None) -> str | None:
        """None when this occurrence is only counted; else the suffix its line ends with:
        "" for the first of its kind, or how many were not logged since the last line."""
        now = self._clock()
        if kind not in self._kinds and len(self._kinds) >= self._max_kinds:
            kind = _OTHERS
        last = self._kinds.get(kind)
        # A clock gone back (a test's, or not monotonic) lets the line pass: never stuck.
        if last is not None and 0 <= now - last[0] < self._interval:
            self._kinds[kind] = (last[0], last[1] + 1)
            return None
        self._kinds[kind] = (now, 0)
        if last is None or last[1] == 0:
            return ""
        return f" ({last[1]} more like it in the last {now - last[0]:.0f} s, not logged)"
