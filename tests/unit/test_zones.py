"""A rule's zone is read from the `tzdata` package alone (`tables.zones`), never from the
system's database, which `zoneinfo` reads first: two nodes with different system data
stepped one cron rule to different instants, and a partition moved between them ran a
job's slot twice in a day, or not at all."""

from __future__ import annotations

import copy
import pickle
import shutil
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import pytest
import tzdata

from tables import zones
from tables.rowcheck import _zone_ok
from tables.rules import CronRule
from tables.slots import first_slot


def _ms(year: int, month: int, day: int, hour: int, minute: int) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


@pytest.fixture
def forged_system_zones(tmp_path: Path) -> Iterator[None]:
    """A system database whose Europe/Berlin is Tokyo's (+9 h all year)."""
    berlin = tmp_path / "Europe" / "Berlin"
    berlin.parent.mkdir()
    with resources.as_file(resources.files(tzdata).joinpath("zoneinfo", "Asia", "Tokyo")) as tokyo:
        shutil.copy(tokyo, berlin)
    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    zones.forget_zones()
    _zone_ok.cache_clear()
    try:
        yield
    finally:
        zoneinfo.reset_tzpath()
        zones.forget_zones()
        _zone_ok.cache_clear()


@pytest.mark.usefixtures("forged_system_zones")
def test_a_rule_steps_in_the_packages_zone_not_the_systems() -> None:
    system = zoneinfo.ZoneInfo.no_cache("Europe/Berlin")
    assert system.utcoffset(datetime(2026, 1, 1)) == timedelta(hours=9), (
        "the forged system database is what zoneinfo reads first"
    )
    rule = CronRule(expr="0 9 * * *", zone="Europe/Berlin")
    slot = first_slot(rule, _ms(2026, 1, 10, 0, 0))
    assert slot is not None and slot.due_at == _ms(2026, 1, 10, 8, 0), "09:00 CET is 08:00 UTC"


def test_only_the_packages_zone_names_are_zones() -> None:
    names = zones.zone_names()
    assert {"Europe/Berlin", "America/Edmonton", "UTC"} <= names
    assert not {"localtime", "posixrules", "Factory", "America", "Europe/"} & names
    for bad in ("localtime", "America", "../etc/passwd", "europe/berlin", "UTC+2"):
        with pytest.raises(zones.UnknownZone):
            zones.zone(bad)
        with pytest.raises(ValueError, match="unknown time zone"):
            CronRule(expr="0 9 * * *", zone=bad)
        assert not _zone_ok(bad)
    assert zones.zone("Europe/Berlin") is zones.zone("Europe/Berlin")
    assert str(zones.zone("Europe/Berlin")) == "Europe/Berlin"
    assert zones.IANA_VERSION == tzdata.IANA_VERSION
    # Copied and pickled by name, as ZoneInfo(name) is (one read from a file is not).
    moment = datetime(2026, 1, 1, tzinfo=zones.zone("Europe/Berlin"))
    assert copy.deepcopy(moment) == moment
    assert pickle.loads(pickle.dumps(moment)).tzinfo is zones.zone("Europe/Berlin")


def test_a_zone_only_the_system_holds_is_still_a_zone(tmp_path: Path) -> None:
    """A zone the package lacks (a newer system database) is read from the system, as
    before: a stored timer of it is kept on a restore, never refused as no Timer."""
    mars = tmp_path / "Mars" / "Olympus_Mons"
    mars.parent.mkdir()
    with resources.as_file(resources.files(tzdata).joinpath("zoneinfo", "Asia", "Tokyo")) as tokyo:
        shutil.copy(tokyo, mars)
    zoneinfo.reset_tzpath(to=[str(tmp_path)])
    zones.forget_zones()
    _zone_ok.cache_clear()
    try:
        assert "Mars/Olympus_Mons" in zones.zone_names() and _zone_ok("Mars/Olympus_Mons")
        rule = CronRule(expr="0 9 * * *", zone="Mars/Olympus_Mons")
        slot = first_slot(rule, _ms(2026, 1, 10, 0, 0))
        assert slot is not None and slot.due_at == _ms(2026, 1, 10, 0, 0), "09:00 at +9"
    finally:
        zoneinfo.reset_tzpath()
        zones.forget_zones()
        _zone_ok.cache_clear()
