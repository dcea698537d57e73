"""The ranges every stored number must stay within: what the store's keys (8-byte
big-endian due times), Python's datetime and any other reader's signed 64-bit integers can
hold. A record outside them is bad input at the edge, never a row."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Final

from pydantic import Field

__all__ = ["MAX_INSTANT", "MAX_INT64", "Count", "Deadline", "Instant", "Interval", "Version"]

MAX_INT64: Final = (1 << 63) - 1
"""The largest signed 64-bit integer: what Java, Go and a JSON reader of another service hold."""

MAX_INSTANT: Final = int(datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC).timestamp() * 1000)
"""The last epoch millisecond Python's datetime can represent (9999-12-31T23:59:59.999Z)."""

Instant = Annotated[int, Field(ge=0, le=MAX_INSTANT)]
"""An epoch millisecond (UTC) from 1970 to the end of year 9999."""

Deadline = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""When the store next hands a row out: an instant, or an instant plus a claim's or a
retry's delay (so a little past `MAX_INSTANT` is possible, never past 64 bits)."""

Interval = Annotated[int, Field(gt=0, le=MAX_INT64)]
"""A positive number of milliseconds."""

Version = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""A version, slot index or count: not negative, within signed 64 bits."""

Count = Version
