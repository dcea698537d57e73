"""A cron rule's matches: stepping through them, and counting them without stepping. Pure.

`cron_after` is the reference: the matches in order, as `tables.slots` steps through them.
`count_matches` counts those between two instants in work that grows with the years
between them, not with the matches: a rule's matches are the local times its second,
minute and hour fields allow on the days its other fields allow, so between two changes
of the zone's UTC offset they are counted by arithmetic on days and times of day. Around
each change, where Debian cron's adjustments depart from the wall clock (see
`tables.slots`), the matches are stepped through instead, within a budget
of steps (`WINDOW_STEPS`); a window with more matches than `WINDOW_MATCHES` (a job of more
than one match every ten seconds or so), or one past the budget, is counted on the wall
clock as it is. That count is exact for any job whose minute or hour field starts with `*`
and for six-field ones, in any zone. It is not for a five-field
job at fixed times (Debian cron fires a skipped time once, at the first valid minute, and a
repeated one once) past the budget: each change beyond it can count the job's matches of
the skipped or repeated hour one time too few or too many.
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
_NAIVE_EPOCH = datetime(1970, 1, 1)  # local times, read by cronsim without a zone
_SECOND = timedelta(seconds=1)
_DAY = 86_400
# further than any zone's offset ever moved at once (a day, Pacific/Apia in 2011)
_REACH = 2 * _DAY
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# a day before year 9999 ends: its local time exists in every zone
_LAST_SCAN = (datetime(9999, 12, 31, tzinfo=UTC) - _EPOCH) // _SECOND
# How far past its last match (or its start) a rule's stretches are walked for the next:
# cronsim's own horizon. A rule matching only local times the zone skips (2:30 on the
# second Sunday of March in New York) matches in no stretch: walked to year 9999, ~16,000
# stretches, seconds of the event loop's time for each search.
_HORIZON = 50 * 366 * _DAY
# what datetime cannot represent: a cron rule has no slot there
_OUT_OF_RANGE = (OverflowError, OSError, ValueError)


def cron_after(rule: CronRule, after: int) -> Iterator[int]:
    """The due times (ms, whole seconds) of `rule`'s matches strictly after `after`, in order.

    Stepped on the wall clock, where cron's fields are read, one stretch of the zone's UTC
    offset at a time: cronsim is given local times without a zone, so none of its own
    daylight-saving steps (which skip matches where clocks change off the hour) is taken,
    and each stretch's matches are its wall-clock matches less its offset. At a change
    the policy of `tables.slots` is applied: a fixed-time job (Debian cron) fires the
    matches of a skipped span once, at the first whole minute after it, and those of a
    repeated span on the first pass only; any other job fires at every local time that
    exists, on both passes of a repeated one.
    """
    zone, fixed = rule.tz, _fixed_time(rule.expr)
    first = after // 1000 + 1  # the first second a match may be at
    try:
        begin, before = _stretch_of(zone, first)
    except _OUT_OF_RANGE:
        return
    last = first - 1
    while True:
        if begin - max(last, first) > _HORIZON:
            return  # as cronsim's own search: no match within 50 years, none at all
        try:
            offset = _seconds(zone, begin)
            end, known = None, begin  # the offset is `offset` from `begin` through `known`
            for second in _stretch_matches(rule.expr, fixed, (begin, offset, before), first):
                while end is None and second > known:
                    probe = min(known + SCAN_SECONDS, _LAST_SCAN)
                    if probe <= known:
                        known = second  # the zone's last stretch: no change to look for
                    elif _seconds(zone, probe) == offset:
                        known = probe
                    else:
                        end = _change_in(zone, known, probe, offset)
                if end is not None and second >= end:
                    break
                if second > last:
                    last = second
                    yield second * 1000
            else:
                return  # no match within 50 years of cronsim's search
        except _OUT_OF_RANGE:
            return
        before, begin = offset, end


def _fixed_time(expr: str) -> bool:
    """Whether cronsim (after Debian cron) moves `expr`'s matches at clock changes: five
    fields, neither the minute nor the hour starting with `*`."""
    fields = expr.split()
    return len(fields) == 5 and not fields[0].startswith("*") and not fields[1].startswith("*")


def _stretch_of(zone: ZoneInfo, second: int) -> tuple[int, int | None]:
    """Where to start stepping for matches at or after `second`: the change just before it
    and the offset before that change, or `second` itself and None when no change is within
    `_REACH` before it (a change further back moves no match at or after `second`)."""
    offset = _seconds(zone, second)
    if _seconds(zone, second - _REACH) == offset:
        return second, None
    change = _change_in(zone, second - _REACH, second, _seconds(zone, second - _REACH))
    return change, _seconds(zone, change - 1)


def _stretch_matches(
    expr: str, fixed: bool, stretch: tuple[int, int, int | None], first: int
) -> Iterator[int]:
    """The matches (seconds, increasing) of the stretch (begin, offset, the offset before
    it or None) from its begin on, none before `first`; without end: the caller stops."""
    begin, offset, before = stretch
    low = begin + offset  # the first local time (wall-clock seconds) the stretch shows
    if fixed and before is not None:
        passed = begin + before  # the local times before it were shown before the change
        if passed < low and _wall_matches(expr, passed, low):
            yield -(-low // 60) * 60 - offset  # a skipped span's matches, once
        low = max(low, passed)  # a repeated span fires on its first pass only
    start = max(low, first + offset) - 1
    for match in CronSim(expr, _NAIVE_EPOCH + timedelta(seconds=start)):
        yield (match - _NAIVE_EPOCH) // _SECOND - offset


def _wall_matches(expr: str, low: int, end: int) -> bool:
    """Whether `expr` matches a local time (wall-clock seconds) in [low, end)."""
    match = next(CronSim(expr, _NAIVE_EPOCH + timedelta(seconds=low - 1)), None)
    return match is not None and (match - _NAIVE_EPOCH) // _SECOND < end


def _change_in(zone: ZoneInfo, same: int, other: int, offset: int) -> int:
    """The first second of the one change of offset in (`same`, `other`]: `same` is at
    `offset`, `other` is not."""
    while other - same > 1:
        middle = (same + other) // 2
        if _seconds(zone, middle) == offset:
            same = middle
        else:
            other = middle
    return other


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
        other = _change_in(zone, probe, ahead, offset)  # one change in (probe, ahead] at most
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
