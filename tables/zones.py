"""Time zones read from the `tzdata` package first, never from the operating system for a
zone the package holds.

`zoneinfo` reads the system's database first (`/usr/share/zoneinfo`) and falls back to the
package. Two nodes with different system data (another base image, a host not updated)
would step one cron rule to different instants: a partition moved between them ran a
job's slot twice in a day, or not at all (a zone whose offset changed between the two
releases of the data). The package is a dependency pinned by the release
(constraints.txt), so every node of a release, the command line's previews included, reads
the same zones (`IANA_VERSION`, exported as a label of `tickwheel_build_info`). A zone
only the system knows (a newer system database, or a host's own) is still read from it,
as before: a stored timer of such a zone is kept, never refused on a restore."""

from __future__ import annotations

import functools
import threading
import zoneinfo
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo

import tzdata

__all__ = ["IANA_VERSION", "UnknownZone", "zone", "zone_names"]

IANA_VERSION: str = tzdata.IANA_VERSION
"""The IANA release of the zones rules are stepped in (e.g. `2026f`)."""

# Files in tzdata and in system databases that are no zone one can name portably.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


class UnknownZone(ValueError):
    """Not the name of a zone of the `tzdata` package nor of the system's database."""


class PackageZone(ZoneInfo):
    """A zone read from the package's file: pickled (and copied) by its name, as a
    `ZoneInfo(name)` is, where one read from a file cannot be."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (zone, (self.key,))


@functools.cache
def _package_names() -> frozenset[str]:
    listed = resources.files(tzdata).joinpath("zones").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in listed.splitlines() if line.strip()) - _NOT_ZONES


@functools.cache
def zone_names() -> frozenset[str]:
    """Every zone name one can give a rule: the package's, and any other the system's
    database holds (no directory's name, nothing that is no zone)."""
    return _package_names() | (frozenset(zoneinfo.available_timezones()) - _NOT_ZONES)


_zones: dict[str, ZoneInfo] = {}
_lock = threading.Lock()  # a backfill steps slots in a thread, beside the event loop


def zone(name: str) -> ZoneInfo:
    """The zone `name`, from the package when it holds it, else from the system's
    database; one object per name. `UnknownZone` for any other name."""
    found = _zones.get(name)
    if found is not None:
        return found
    with _lock:
        if (found := _zones.get(name)) is None:
            found = _zones[name] = _read(name)
        return found


def _read(name: str) -> ZoneInfo:
    if name not in zone_names():
        raise UnknownZone(f"unknown time zone {name!r} (use an IANA name)")
    try:
        if name in _package_names():
            path = resources.files(tzdata).joinpath("zoneinfo", *name.split("/"))
            with path.open("rb") as data:
                return PackageZone.from_file(data, key=name)
        return ZoneInfo(name)
    except (OSError, ValueError) as exc:
        raise UnknownZone(f"time zone {name!r} cannot be read: {exc}") from exc


def forget_zones() -> None:
    """Drops the zones read and the names known (for tests that change the databases)."""
    with _lock:
        _zones.clear()
    _package_names.cache_clear()
    zone_names.cache_clear()
