"""`RoundState`: what a run of rounds over one group of partitions keeps from one round
to the next. A node's partition keeps its own (`PartitionFiring.rounds`: its rounds are
its own), the runner one for the seed's round over all its partitions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

__all__ = ["RoundState"]


@dataclass
class RoundState:
    """Its lock (one round's loads and claims at a time: store calls only, never held
    across a ledger or Kafka call, nor while a node commits the claims), the slice of its
    burst under way (its last round left rows due; None: no burst, `slow_start`), how many
    its last round found due (a burst begins only on a rise: `round_slice`'s `rising`) and
    whose turn its sweep is."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    burst: int | None = None
    last_due: int = 0
    sweep_turn: int = 0

    @property
    def bursting(self) -> bool:
        """Whether a burst is under way: its last round left rows due (`slow_start`)."""
        return self.burst is not None
