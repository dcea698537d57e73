"""How old a request may be when it is read and still be told from one carried out.

A node keeps each request id it carried out for `TICKWHEEL_REQUEST_ID_WINDOW_MS` from then,
by its own clock, and that was no earlier than the request's record was written. A request
whose record is older than the window (less a margin for the hosts' clocks) may have been
carried out under an id forgotten since (a group whose offsets were deleted or expired
reads its topic from the start), so whether it was cannot be told. So may one whose record
is dated further ahead of the node's clock than that margin: carried out now, its id is
forgotten a window from now, while its record stays within the window by its own date for
as long as it is dated ahead. Commands (`app.commands.intake`) and operators' timer
requests (`app.timers.applied_ops`) are judged by this one rule. No I/O.
"""

from __future__ import annotations

from typing import Final

__all__ = ["AHEAD_MS", "ahead_of_clock", "margin_ms", "written_ago"]

AHEAD_MS: Final = 3_600_000
"""How far ahead of a node's clock a request's record may be dated at least (an hour, what a
broker of Kafka 4 takes by default, `log.message.timestamp.after.max.ms`), when
`TICKWHEEL_CLOCK_SKEW_MS` allows less: a producer's clock a few seconds ahead is common."""


def margin_ms(window_ms: int, skew_ms: int) -> int:
    """The margin a request's date is judged with: the clocks' skew allowed, an hour at
    least (`AHEAD_MS`), at most half the window."""
    return min(max(skew_ms, AHEAD_MS), window_ms // 2)


def written_ago(
    record_timestamp: int, claimed: int, now: int, window_ms: int, skew_ms: int
) -> int | None:
    """How long before `now` a request was written, when that is outside what the window
    its id is kept for tells apart: longer ago than `window_ms` less the margin
    (`margin_ms`), or dated ahead of `now` by more than the margin (negative). None: within
    it. Dated by its record's timestamp, not by the time its sender claims (`claimed`, an
    `issued_at` or `requested_at`), which counts only for a record without one (-1).
    A dead letter replayed is written afresh: within."""
    dated = record_timestamp if record_timestamp >= 0 else claimed
    margin = margin_ms(window_ms, skew_ms)
    if now - window_ms + margin < dated <= now + margin:
        return None
    return now - dated


def ahead_of_clock(ahead: int, window_ms: int, skew_ms: int) -> str:
    """Why a request dated `ahead` ms ahead of the node's clock, past the margin, is not
    carried out (`written_ago` negative)."""
    return (
        f"dated {ahead} ms ahead of this node's clock, more than the "
        f"{margin_ms(window_ms, skew_ms)} ms allowed (an hour, or TICKWHEEL_CLOCK_SKEW_MS "
        "when longer, at most half of TICKWHEEL_REQUEST_ID_WINDOW_MS): its id would be "
        "forgotten while its record still read as within the window, so it is not; fix "
        "the sender's clock or its record's timestamp, and send it again under a new "
        "request id"
    )
