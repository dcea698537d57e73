"""A cron rule's matches: stepping through them, and counting them without stepping. Pure.

`cron_after` is the reference: the matches in order, as `tables.slots` steps through them.
`count_matches` counts those between two instants in work that grows with the years
between them, not with the matches: a rule's matches are the local times its second,
minute and hour fields allow on the days its other fields allow, so between two changes
of the zone's UTC offset they are counted by arithmetic on days and times of day. Around
each change, where Debian cron's adjustments and cronsim's own steps depart from the
wall clock (see `tables.slots`), the matches are stepped through instead, within a budget
of steps (`WINDOW_STEPS`); a window with more matches than `WINDOW_MATCHES` (a job of more
than one match every ten seconds or so), or one past the budget, is counted on the wall
clock as it is. That count is exact for any job whose minute or hour field starts with `*`
and for six-field ones, in zones whose clocks change on the hour. It is not for a five-field
job at fixed times (Debian cron fires a skipped time once, at the first valid minute, and a
repeated one once) past the budget: each change beyond it can count the job's matches of
the skipped or repeated hour one time too few or too many. Nor for a dense job in a zone
whose clocks change off the hour (Pacific/Chatham, Australia/Lord_Howe), where cronsim can
skip a few matches of the repeated hour's second pass.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from itertools import islice, pairwise, takewhile
from zoneinfo import ZoneInfo

from cronsim import CronSim

from tables.rules import CronRule

__all__ = [
    "SCAN_SECONDS",
    "WINDOW_MATCHES",
    "WINDOW_STEPS",
    "count_matches",
    "cron_after",
    "nth_match_after",
]

SCAN_SECONDS = 6 * 86_400
"""How far apart the zone's offset is read to find its changes: no two changes of any zone
since 1970 are closer (a week at least in tzdata; a test checks the installed one)."""

WINDOW_MATCHES = 1_000
"""A clock change's window with more matches than this is counted, not stepped through."""

WINDOW_STEPS = 1_000
"""The steps a catch-up takes around clock changes at most (~5-40 ms on the event loop)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)
_DAY = 86_400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# a day before year 9999 ends: its local time exists in every zone
_LAST_SCAN = (datetime(9999, 12, 31, tzinfo=UTC) - _EPOCH) // _SECOND
# what datetime cannot represent: a cron rule has no slot there
_OUT_OF_RANGE = (OverflowError, OSError, ValueError)


def cron_after(rule: CronRule, after: int) -> Iterator[int]:
    """The due times (ms, whole seconds) of `rule`'s matches strictly after `after`, in order."""
    zone = rule.tz
    last = after // 1000
    start = last
    try:
        # Started just before or in the hour after a clock change, cronsim can set the clock
        # to a local time the change skipped and miss a match; from hours before, it walks
        # through the change as an iteration from long before does.
        if _offset(last - 2 * 3600, zone) != _offset(last + 3600, zone):
            start = last - 4 * 3600
    except _OUT_OF_RANGE:
        return
    jump = 0
    while True:
        try:
            matches = CronSim(rule.expr, datetime.fromtimestamp(start, zone))
        except _OUT_OF_RANGE:
            return
        previous, wraps = start, 0
        while wraps < 2:
            try:
                match = next(matches)
            except StopIteration:  # no match within 50 years of cronsim's search
                return
            except _OUT_OF_RANGE:
                return
            second = (match - _EPOCH) // _SECOND
            if second <= previous:
                # Fixed-time jobs step on the wall clock, so one started in the second pass
                # of a fall-back hour first matches in the first pass: once is expected.
                wraps += 1
            previous = second
            if second > last:
                last, jump = second, 0
                yield second * 1000
        # Going round in circles (fall-back hours not on the hour, e.g. Pacific/Chatham, can
        # send cronsim back to the hour's start for ever): restart ever further past `last`.
        jump = max(1, 2 * jump)
        start = last + jump


def _before(dues: Iterator[int], second: int) -> Iterator[int]:
    return takewhile(lambda due: due < second * 1000, dues)


def _offset(second: int, zone: ZoneInfo) -> timedelta | None:
    return datetime.fromtimestamp(second, zone).utcoffset()


def count_matches(rule: CronRule, after: int, until: int, steps: int) -> tuple[int, int]:
    """How many of `rule`'s matches are due in (`after`, `until`] (ms), and how many of
    `steps` (the budget of matches to step through around clock changes) are left."""
    low, end = after // 1000 + 1, until // 1000 + 1  # the seconds [low, end) a match may be at
    if end <= low:
        return 0, steps
    shape, zone = _shape(rule.expr), rule.tz
    # a change up to a day before or after the span moves matches within it too
    pieces = _pieces(zone, low - 2 * _DAY, end + 2 * _DAY)
    total = sum(_local(shape, low, end, piece) for piece in pieces)
    for (start, change, before), (_, stop, after_) in pairwise(pieces):
        # the change's window: as far as the offset moved, and an hour of cronsim's margins
        reach = abs(after_ - before) + 3600
        begin, finish = max(low, start, change - reach), min(end, stop, change + reach)
        if finish <= begin:
            continue
        window = (begin, change, before), (change, finish, after_)
        modelled = sum(_local(shape, begin, finish, piece) for piece in window)
        if modelled > min(WINDOW_MATCHES, steps):
            continue  # too dense to step, or the budget is spent: the wall clock's count
        # Debian cron moves a skipped match by a minute or so: never twice as many
        limit = 2 * modelled + 2
        dues = _before(cron_after(rule, (begin - 1) * 1000), finish)
        stepped = sum(1 for _ in islice(dues, limit + 1))
        steps -= stepped
        if stepped <= limit:
            total += stepped - modelled
    return total, steps


def _local(shape: _Shape, low: int, end: int, piece: tuple[int, int, int]) -> int:
    """The matches of `piece` (begin, end, offset) within the seconds [low, end)."""
    begin, stop, offset = piece
    return shape.local(max(begin, low) + offset, min(stop, end) + offset)


def nth_match_after(rule: CronRule, after: int, n: int, until: int, steps: int) -> int:
    """The due time of the `n`-th match after `after` (`n` >= 1), one due by `until` (ms).

    Bisection over time, each probe counting the half of the span left: all the probes
    together count about twice the span.
    """
    # invariant: fewer than n matches in (after, low], n or more in (after, high]
    low, high, below = after // 1000, until // 1000, 0
    while high - low > 1:
        middle = (low + high) // 2
        found, steps = count_matches(rule, low * 1000, middle * 1000, steps)
        if below + found >= n:
            high = middle
        else:
            low, below = middle, below + found
    # where a count was off (see the module), the next match after `low` is still a match
    due = next(cron_after(rule, low * 1000), None)
    return until if due is None or due > until else due


def _pieces(zone: ZoneInfo, low: int, high: int) -> list[tuple[int, int, int]]:
    """[low, high) (seconds) cut where the zone's offset changes: (begin, end, offset)."""
    pieces, begin, offset = [], low, _seconds(zone, low)
    probe, last = low, min(high - 1, _LAST_SCAN)
    while probe < last:
        ahead = min(probe + SCAN_SECONDS, last)
        if _seconds(zone, ahead) == offset:
            probe = ahead
            continue
        # one change in (probe, ahead] at most: bisect for its first second
        same, other = probe, ahead
        while other - same > 1:
            middle = (same + other) // 2
            if _seconds(zone, middle) == offset:
                same = middle
            else:
                other = middle
        pieces.append((begin, other, offset))
        begin, offset, probe = other, _seconds(zone, other), other
    pieces.append((begin, high, offset))
    return pieces


def _seconds(zone: ZoneInfo, second: int) -> int:
    offset = _offset(second, zone)
    return 0 if offset is None else offset // _SECOND


class _Shape:
    """An expression's fields as counts: matching times of a day, matching days of a month."""

    def __init__(self, expr: str) -> None:
        self.cron = CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
        hours, minutes, seconds = self.cron.hours, self.cron.minutes, self.cron.seconds
        self.per_day = len(hours) * len(minutes) * len(seconds)
        # how many of each field's values are below v, for v in 0..60
        self.hours_below = [sum(h < v for h in hours) for v in range(61)]
        self.minutes_below = [sum(m < v for m in minutes) for v in range(61)]
        self.seconds_below = [sum(s < v for s in seconds) for v in range(61)]
        self.hours, self.minutes = hours, minutes
        self.per_hour, self.per_minute = len(minutes) * len(seconds), len(seconds)
        self.months: dict[tuple[int, int, int], int] = {}
        self.years: dict[tuple[bool, int], int] = {}

    def local(self, begin: int, end: int) -> int:
        """The matching local wall-clock seconds in [begin, end) (seconds since 1970-01-01)."""
        if end <= begin:
            return 0
        first, start = divmod(begin, _DAY)
        last, stop = divmod(end, _DAY)
        if first == last:
            return self.day(first) * (self.time_below(stop) - self.time_below(start))
        total = self.day(first) * (self.per_day - self.time_below(start))
        total += self.days(first + 1, last) * self.per_day
        if stop:  # the day `end` begins may be past year 9999
            total += self.day(last) * self.time_below(stop)
        return total

    def time_below(self, second: int) -> int:
        """The matching times of a day before `second` (0 to 86,400) of it."""
        hour, rest = divmod(second, 3600)
        minute, sec = divmod(rest, 60)
        total = self.hours_below[hour] * self.per_hour
        if hour in self.hours:
            total += self.minutes_below[minute] * self.per_minute
            if minute in self.minutes:
                total += self.seconds_below[sec]
        return total

    def day(self, day: int) -> int:
        when = date.fromordinal(_EPOCH_ORDINAL + day)
        return int(when.month in self.cron.months and self.cron.match_day(when))

    def days(self, first: int, end: int) -> int:
        """The matching days in [first, end) (days since 1970-01-01): whole years and months
        from tables of their own, so decades cost a few hundred look-ups."""
        total, day = 0, first
        while day < end:
            when = date.fromordinal(_EPOCH_ORDINAL + day)
            if when.day == 1 and when.month == 1 and day + 365 + _leap(when.year) <= end:
                total += self.year(when)
                day += 365 + _leap(when.year)
            elif when.day == 1 and day + _month_days(when) <= end:
                total += self.month(when)
                day += _month_days(when)
            else:
                total += self.day(day)
                day += 1
        return total

    def year(self, first: date) -> int:
        # a year's days match as any other year's of the same length and first weekday
        key = (bool(_leap(first.year)), first.weekday())
        if key not in self.years:
            self.years[key] = sum(self.month(first.replace(month=m)) for m in range(1, 13))
        return self.years[key]

    def month(self, first: date) -> int:
        key = (first.month, _month_days(first), first.weekday())
        if key not in self.months:
            match = self.cron.match_day
            days = (first.replace(day=d) for d in range(1, key[1] + 1))
            self.months[key] = sum(map(match, days)) if first.month in self.cron.months else 0
        return self.months[key]


def _leap(year: int) -> int:
    return int(year % 4 == 0 and (year % 100 != 0 or year % 400 == 0))


def _month_days(first: date) -> int:
    if first.month == 2:
        return 28 + _leap(first.year)
    return 30 if first.month in (4, 6, 9, 11) else 31


@functools.lru_cache(maxsize=256)
def _shape(expr: str) -> _Shape:
    return _Shape(expr)
