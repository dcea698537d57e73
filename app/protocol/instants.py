"""The text form of an instant on the command line and in an HTTP query: ISO 8601 with
its offset (`2026-12-24T18:00:00Z`, `2026-03-29T03:00:00+02:00`) or epoch milliseconds
(`1798135200000`). A time without an offset is refused: in a zone's repeated autumn hour it
would name two instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tables.bounds import MAX_INSTANT

__all__ = ["PAST_DATES", "BadInstant", "iso_text", "parse_instant"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_MAX_DIGITS = len(str(MAX_INSTANT))


PAST_DATES = "after 9999-12-31"
"""What is printed of an instant past what a date holds (a timer due near the end of 9999
plus its jitter, a forged record's time, a slot in a zone ahead of UTC)."""


def iso_text(ms: int) -> str:
    """`ms` as an ISO instant with its offset (`+00:00`), or said in words past what a date
    holds: never an error that ends a listing partway."""
    try:  # exact: a float of the seconds rounds the last millisecond of 9999 into 10000
        return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError):
        return PAST_DATES if ms > 0 else f"before 0001-01-01 ({ms} ms)"


class BadInstant(ValueError):
    """Text that is no instant; the message names it and says why."""


def parse_instant(text: str, what: str = "instant") -> int:
    """Epoch ms of an ISO 8601 time with its offset, or of epoch ms given as digits;
    `BadInstant` naming `what` otherwise, or outside 1970 to 9999."""
    text = text.strip()
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    # isdigit() alone is true of "²", which int() refuses; and int() refuses more than
    # 4,300 digits: leading zeros aside, more digits than MAX_INSTANT's is out of range.
    if text.isascii() and text.isdigit():
        digits = text.lstrip("0") or "0"
        ms = int(digits) if len(digits) <= _MAX_DIGITS else MAX_INSTANT + 1
    else:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError as exc:
            raise BadInstant(
                f"{what} {shown} is neither ISO 8601 (2026-12-24T18:00:00Z) nor epoch ms"
            ) from exc
        if moment.utcoffset() is None:
            raise BadInstant(
                f"{what} {shown} has no offset: add Z or +hh:mm (a local time can name two "
                "instants)"
            )
        ms = (moment - _EPOCH) // _MS
    if not 0 <= ms <= MAX_INSTANT:
        raise BadInstant(f"{what} {shown} is outside 1970-01-01 to 9999-12-31 (UTC)")
    return ms
