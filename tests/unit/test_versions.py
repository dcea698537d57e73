"""Versions: one version (package metadata, pyproject, `app.__version__`, the build-info
metric, the changelog), runtime dependencies as ranges that install beside other packages,
the exact set CI tests in constraints.txt, and the license the package declares."""

from __future__ import annotations

import importlib.metadata as md
import platform
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tzdata
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

import app
from app.node.metrics import KAFKA_CLIENT_API, NodeMetrics

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT: dict[str, Any] = PYPROJECT["project"]
EXTRAS = ("dev", "faust")
"""The extras CI installs (scripts/bootstrap-venv)."""

UNBOUNDED = {
    "tzdata": "IANA time zone data, calendar-versioned: every release is read by any zoneinfo",
}
"""Runtime dependencies without an upper bound, and why none can break us."""


def runtime() -> list[Requirement]:
    """What `pip install tickwheel[faust,confluent]` asks for: the dependencies and the
    optional extras a service installs beside its own packages."""
    extras = PROJECT["optional-dependencies"]
    deps = [*PROJECT["dependencies"], *extras["faust"], *extras["confluent"]]
    return [Requirement(r) for r in deps]


def declared() -> list[Requirement]:
    """Every requirement pyproject declares, extras included."""
    extras = PROJECT["optional-dependencies"]
    every = [*PROJECT["dependencies"], *extras["dev"], *extras["faust"], *extras["confluent"]]
    return [Requirement(r) for r in every]


def constraints() -> dict[NormalizedName, Requirement]:
    pins: dict[NormalizedName, Requirement] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            name = canonicalize_name(req.name)
            assert name not in pins, f"{req.name} pinned twice in constraints.txt"
            pins[name] = req
    return pins


def installed_closure() -> dict[NormalizedName, str]:
    """Every distribution `pip install -e '.[dev,faust]'` pulled into this environment, by
    name, at its installed version: the project's requirements, theirs, and so on (markers
    evaluated here, extras followed)."""
    todo: list[Requirement] = [
        Requirement(r) for r in md.requires("tickwheel") or [] if _wanted(Requirement(r), EXTRAS)
    ]
    found: dict[NormalizedName, str] = {}
    extras_seen: dict[NormalizedName, set[str]] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        extras = extras_seen.setdefault(name, set())
        if name in found and set(req.extras) <= extras:
            continue
        extras |= set(req.extras)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            pytest.fail(f"{req} is required but not installed: reinstall (scripts/bootstrap-venv)")
        found[name] = dist.version
        todo += [r for r in map(Requirement, dist.requires or []) if _wanted(r, tuple(extras))]
    return found


def _wanted(req: Requirement, extras: tuple[str, ...]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": e}) for e in (*extras, ""))


# --- one version ---------------------------------------------------------------------------


def test_the_version_is_the_metadatas_and_pyprojects() -> None:
    assert app.__version__ == md.version("tickwheel") == PROJECT["version"], (
        "pyproject's version changed: reinstall (pip install -c constraints.txt -e '.[dev,faust]')"
    )
    assert str(Version(app.__version__)) == app.__version__, "not a normalized PEP 440 version"


def test_a_source_tree_not_installed_takes_pyprojects_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def not_installed(name: str) -> str:
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", not_installed)
    assert app._version() == PROJECT["version"]


def test_the_changelog_has_an_entry_for_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.M)
    assert app.__version__ in headings, f"CHANGELOG.md has no `## [{app.__version__}]`"
    released = [h for h in headings if h != "Unreleased"]
    assert released == sorted(released, key=Version, reverse=True), "newest first"


def test_a_node_exports_its_build_info() -> None:
    registry = NodeMetrics().registry
    labels = {
        "version": app.__version__,
        "python": platform.python_version(),
        "aiokafka": md.version("aiokafka"),
        "kafka_client_api": KAFKA_CLIENT_API,
        "tzdata": tzdata.IANA_VERSION,
    }
    assert registry.get_sample_value("tickwheel_build_info", labels) == 1
    [family] = [f for f in registry.collect() if f.name == "tickwheel_build_info"]
    assert len(family.samples) == 1


# --- ranges, and the exact set CI tests ---------------------------------------------------------


def test_no_runtime_dependency_is_pinned() -> None:
    pinned = [str(r) for r in runtime() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert not pinned, f"pinned: {pinned}; declare a range, pin in constraints.txt"


def test_every_runtime_dependency_has_a_lower_and_an_upper_bound() -> None:
    for req in runtime():
        operators = {s.operator for s in req.specifier}
        assert operators & {">=", ">", "~="}, f"{req} has no lower bound"
        if canonicalize_name(req.name) not in UNBOUNDED:
            assert operators & {"<", "<=", "~="}, f"{req} has no upper bound"


def test_the_constraints_pin_exactly_what_the_project_installs() -> None:
    pins = constraints()
    for req in pins.values():
        [spec] = req.specifier
        assert spec.operator == "==" and "*" not in spec.version, f"{req} is no exact pin"
        assert not req.marker and not req.extras, f"{req}: a pin, nothing else"
    installed = installed_closure()
    assert set(installed) - set(pins) == set(), "installed, not pinned in constraints.txt"
    assert set(pins) - set(installed) == set(), "pinned, but nothing of the project needs it"
    assert "tickwheel" not in pins
    drifted = {
        n: (v, next(iter(pins[n].specifier)).version)
        for n, v in installed.items()
        if not pins[n].specifier.contains(v, prereleases=True)
    }
    assert not drifted, f"installed (left) is not what constraints.txt pins (right): {drifted}"


def test_each_pin_lies_within_pyprojects_range() -> None:
    pins = constraints()
    for req in declared():
        pin = pins.get(canonicalize_name(req.name))
        assert pin is not None, f"{req.name} is declared but not pinned in constraints.txt"
        version = next(iter(pin.specifier)).version
        assert req.specifier.contains(version, prereleases=True), f"{pin} is outside {req}"


def test_the_venv_is_installed_with_the_constraints() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap-venv").read_text()
    assert "-c constraints.txt -e '.[dev,faust]'" in bootstrap
    assert "constraints.txt" in bootstrap.split("stamp=", 1)[1].splitlines()[0], (
        "a changed constraints.txt must reinstall"
    )


# --- the license ---------------------------------------------------------------------------------


def test_the_license_is_there_and_pyproject_names_it() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    meta = md.metadata("tickwheel")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
