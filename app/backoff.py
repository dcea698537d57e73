"""The capped exponential backoff every retry loop of the node computes alike: `initial`
growing by `multiplier` per step, never past `cap`, and never an overflow however many
steps (a fault that never passes counts its failures for as long as the node runs). A
leaf: it imports nothing of `app`."""

from __future__ import annotations

__all__ = ["capped_backoff"]


def capped_backoff(initial: float, cap: float, step: int, multiplier: float = 2.0) -> float:
    """`initial * multiplier ** step`, at most `cap`; `step` <= 0 is `initial` (at most
    `cap`). Non-decreasing in `step` for any int, huge or negative. What a caller waits
    for no step at all (0 s before a first retry) is the caller's to say.

    Raises ValueError for a negative `initial` or `cap`, or a `multiplier` below 1 (a
    backoff that shrinks): no step does."""
    if not (initial >= 0 and cap >= 0 and multiplier >= 1):  # NaN fails each
        raise ValueError(f"no backoff grows from {initial} by {multiplier} up to {cap}")
    if step <= 0 or initial == 0 or multiplier == 1:
        return float(min(initial, cap))
    try:
        # A float power: an int one (2 ** 10**9) would be computed in full first.
        grown = initial * float(multiplier) ** step
    except OverflowError:
        # A power past the largest float (or a step too large to be one) is past any cap.
        return float(cap)
    return float(min(grown, cap))
