"""How many timers a partition is handed to fire in-process (`FireWindow`): a burst is
decided in chunks, each as soon as the last one was decided, while the partition's
uncommitted fired timers stay under a window.

Why: the runner used to hand a partition every timer due at once (1,000 a round), its
cycles decided them back to back, and the event loop ran those cycles for seconds while
the first transaction's few round trips each waited behind them: the first fire of a
10,000 burst came ~1-3 s after it was due. Small chunks keep each of the loop's turns
short, so that the first chunk's commit goes out at once; the window keeps the decided
work only so far ahead of the commits that carry it, which batch what waits meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping

from app.commands.processor import CommandProcessor
from app.node.kept import KeptType

__all__ = ["FireWindow"]

Key = tuple[str, int]
"""A type's name and a partition."""


class FireWindow:
    """Per type and partition: the timers handed over and not decided yet, and those
    decided whose transaction has not committed yet."""

    def __init__(
        self,
        types: Mapping[str, KeptType],
        processor: Callable[[str, int], CommandProcessor | None],
    ) -> None:
        self._types = types
        self._processor = processor
        self._undecided: Counter[Key] = Counter()
        self._uncommitted: Counter[Key] = Counter()
        self._turns = asyncio.Lock()

    async def turn(self) -> None:
        """Waits for a firing cycle's turn: one starts per turn of the event loop, so that a
        burst's commits (each a chain of round trips, one step per turn) are not held up
        behind every partition's cycle at once. Not held over the cycle (it may wait)."""
        async with self._turns:
            await asyncio.sleep(0)

    def room(self, type_name: str, p: int) -> int | None:
        """How many due timers of p its cycles take now to fire in-process: none while its
        last chunk is not decided; else a chunk (`TimerOptions.fire_chunk`), or what is left
        of the window (`fire_window`). None: p's commands are not decided here."""
        kept = self._types.get(type_name)
        if kept is None or self._processor(type_name, p) is None:
            return None
        options = kept.runner.options
        return self.left((type_name, p), options.fire_chunk, options.fire_window)

    def left(self, key: Key, chunk: int, window: int) -> int:
        """Room of `key`: none while what it was handed last is not decided; a chunk when
        nothing of it waits for a commit (its first commit goes out at once, small); else
        what is left of the window (the next commit takes all that was decided meanwhile:
        few, large transactions, as the broker's cost is per transaction)."""
        if self._undecided[key]:
            return 0
        waiting = self._uncommitted[key]
        return min(chunk, window) if not waiting else max(0, window - waiting)

    def wake_held(self, kept: KeptType, p: int) -> None:
        """Wakes the runner that holds p's due timers back, once p has room for them."""
        if p in kept.runner.held and self.room(kept.name, p):
            kept.loop.wake(reload=False)

    def handed(self, key: Key, n: int) -> None:
        self._undecided[key] += n

    def decided(self, key: Key, handed: int, kept: int) -> None:
        """Of `handed` taken by a cycle, `kept` were decided (the rest no longer due): they
        wait for the transaction until `committed`."""
        _take(self._undecided, key, handed)
        self._uncommitted[key] += kept

    def committed(self, key: Key, n: int) -> None:
        _take(self._uncommitted, key, n)

    def drop(self, partition: int) -> None:
        """The partition was let go: nothing of it waits (a commit of before that ends
        late can only leave it more room, never less: counts stop at zero)."""
        for counter in (self._undecided, self._uncommitted):
            for key in [k for k in counter if k[1] == partition]:
                del counter[key]


def _take(counter: Counter[Key], key: Key, n: int) -> None:
    left = counter[key] - n
    if left > 0:
        counter[key] = left
    else:
        del counter[key]
