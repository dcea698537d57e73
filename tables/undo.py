"""What a partition's writes changed since its last landed commit (`Undo`): each row
written, with the row it replaced, in the order their changelog records went to the
partition's transaction. A commit that lands takes its rows off the front (`landed`); a
partition whose commit failed is rolled back to what its landed commits left
(`befores`: the row each key held before its first write not landed), so its local copy
holds committed writes only and is read on from its changelog, not restored whole."""

from __future__ import annotations

from tables.timer import Timer

__all__ = ["Undo"]


class Undo:
    """The (row key, row it replaced or None) of each write not landed yet, oldest first."""

    __slots__ = ("_entries", "rolled_back")

    def __init__(self) -> None:
        self._entries: list[tuple[bytes, Timer | None]] = []
        # Rolled back: its partition takes no write of this serving any more.
        self.rolled_back = False

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, row: bytes, before: Timer | None) -> None:
        """A write of `row` handed to the transaction, which replaced `before`."""
        self._entries.append((row, before))

    def landed(self, rows: int) -> None:
        """The oldest `rows` writes committed: they are undone no more."""
        del self._entries[:rows]

    def befores(self) -> dict[bytes, Timer | None]:
        """Per row key written and not landed, the row it held before the first such write
        (None: it held none): what the landed commits left there."""
        out: dict[bytes, Timer | None] = {}
        for row, before in self._entries:
            out.setdefault(row, before)
        return out

    def clear(self) -> None:
        self._entries.clear()
