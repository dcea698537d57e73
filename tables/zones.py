"""Time zones read from the `tzdata` package alone, never from the operating system.

`zoneinfo` reads the system's database first (`/usr/share/zoneinfo`) and falls back to the
package. Two nodes with different system data (another base image, a host not updated)
would step one cron rule to different instants: a partition moved between them ran a
job's slot twice in a day, or not at all (a zone whose offset changed between the two
releases of the data). The package is a dependency pinned by the release
(constraints.txt), so every node of a release, the command line's previews included, reads
the same zones (`IANA_VERSION`, exported as a label of `tickwheel_build_info`)."""

from __future__ import annotations

import functools
from importlib import resources
from zoneinfo import ZoneInfo

import tzdata

__all__ = ["IANA_VERSION", "UnknownZone", "zone", "zone_names"]

IANA_VERSION: str = tzdata.IANA_VERSION
"""The IANA release of the zones every rule is stepped in (e.g. `2026f`)."""


class UnknownZone(ValueError):
    """Not the name of a zone of the `tzdata` package."""


@functools.cache
def zone_names() -> frozenset[str]:
    """Every zone name one can give a rule: the package's own list (no directory's name),
    less the names that are no zone one can name portably."""
    listed = resources.files(tzdata).joinpath("zones").read_text(encoding="utf-8")
    names = {line.strip() for line in listed.splitlines() if line.strip()}
    return frozenset(names - {"localtime", "posixrules", "Factory"})


@functools.lru_cache(maxsize=1024)
def zone(name: str) -> ZoneInfo:
    """The zone `name` as the package holds it (one object per name, as `ZoneInfo(name)`
    keeps). `UnknownZone` for any other name."""
    if name not in zone_names():
        raise UnknownZone(f"unknown time zone {name!r} (use an IANA name)")
    path = resources.files(tzdata).joinpath("zoneinfo", *name.split("/"))
    try:
        with path.open("rb") as data:
            return ZoneInfo.from_file(data, key=name)
    except (OSError, ValueError) as exc:
        raise UnknownZone(f"time zone {name!r} cannot be read from tzdata: {exc}") from exc
