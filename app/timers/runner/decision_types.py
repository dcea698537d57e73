"""What a runner's decision is: the `Action` it takes and the `Decision` itself (the one
conditional write to make, and whether to send or park), as the rules of `decisions` return
them and the loop carries them out."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from tables.timer import TimerChange

__all__ = ["NOTHING", "Action", "Decision"]


class Action(StrEnum):
    NOTHING = "nothing"
    EXPIRE = "expire"
    """A slot due longer ago than `expires_after`, and no next one: CANCELLED/EXPIRED."""
    EXPIRE_SLOT = "expire_slot"
    """An expired slot of a recurring rule: PENDING at the rule's first slot not expired,
    the slots passed over counted as skipped."""
    CLAIM = "claim"
    FIRE = "fire"
    """The last slot fired: FIRED."""
    NEXT_SLOT = "next_slot"
    """A slot fired and the rule has another: PENDING at it."""
    RETRY = "retry"
    BUSY = "busy"
    PARK = "park"
    RELEASE = "release"
    """A claim given back unsent (the partition was handed off): due again now."""
    OPERATOR_RETRY = "operator_retry"
    OPERATOR_REFUSED = "operator_refused"
    """An operator's retry of a PARKED slot its target may have forgotten (`held_until`
    passed), not asked past the window: nothing written, the timer left PARKED."""
    OPERATOR_SKIP = "operator_skip"


@dataclass(frozen=True, slots=True)
class Decision:
    """One conditional write, and what the loop does around it.

    `fallback` is written instead of `change` when a park's ledger record fails.
    `busy_in_a_row` is the timer's count of BUSY refusals in a row after this decision.
    """

    action: Action
    change: TimerChange | None = None
    send: bool = False
    fallback: TimerChange | None = None
    busy_in_a_row: int = 0

    @property
    def park(self) -> bool:
        return self.action is Action.PARK


NOTHING: Final = Decision(Action.NOTHING)
"""The decision that writes nothing."""
