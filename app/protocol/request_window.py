"""How old a request may be when it is read and still be told from one carried out.

A node keeps each request id it carried out for `TICKWHEEL_REQUEST_ID_WINDOW_MS` from then,
by its own clock, and that was no earlier than the request's record was written. A request
whose record is older than the window (less the hosts' clock skew allowed) may have been
carried out under an id forgotten since (a group whose offsets were deleted or expired
reads its topic from the start), so whether it was cannot be told. Commands
(`app.commands.intake`) and operators' timer requests (`app.timers.applied_ops`) are
judged by this one rule. No I/O.
"""

from __future__ import annotations

__all__ = ["written_ago"]


def written_ago(
    record_timestamp: int, claimed: int, now: int, window_ms: int, skew_ms: int
) -> int | None:
    """How long before `now` a request was written, when that is past the window its id is
    kept for: `window_ms` less the clocks' skew allowed (`skew_ms`, at most half the
    window). None: within it. Dated by its record's timestamp, not by the time its sender
    claims (`claimed`, an `issued_at` or `requested_at`: a sender dating it ahead would keep
    it decidable past its id's keeping), which counts only for a record without one (-1).
    A dead letter replayed is written afresh: within."""
    dated = record_timestamp if record_timestamp >= 0 else claimed
    if dated > now - window_ms + min(skew_ms, window_ms // 2):
        return None
    return now - dated
