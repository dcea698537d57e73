"""Every third-party module the package imports is a dependency pyproject declares.

A module present only as another package's dependency (yarl and multidict through aiohttp,
pydantic_core through pydantic) installs today, but nothing promises it tomorrow: the
package that pulls it in may drop it, or take a version our code does not work with. So the
imports of app/ and tables/ are read (ast, no import executed) and each top-level module
is mapped to the distributions that provide it in this environment."""

from __future__ import annotations

import ast
import importlib.metadata as md
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "tables")
"""The installed packages (pyproject's [tool.setuptools.packages.find])."""
OPTIONAL = ("faust", "confluent")
"""The extras whose modules the package imports where a service asks for them."""


def declared_runtime() -> set[NormalizedName]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = [*project["dependencies"], *(r for e in OPTIONAL for r in extras[e])]
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def imported_modules(path: Path) -> Iterator[tuple[str, int]]:
    """The top-level module of each absolute import of a source file, with its line."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".", 1)[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".", 1)[0], node.lineno


def third_party_imports() -> dict[str, list[str]]:
    """Each third-party top-level module, and where it is imported (path:line)."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for module, line in imported_modules(path):
                if module in sys.stdlib_module_names or module in PACKAGES:
                    continue
                found.setdefault(module, []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def test_the_scan_sees_the_packages_imports() -> None:
    # the scan is not vacuous: it finds what the package is built on
    found = third_party_imports()
    assert {"aiokafka", "pydantic", "rocksdict", "aiohttp"} <= set(found)


def test_every_third_party_import_is_a_declared_dependency() -> None:
    declared = declared_runtime()
    providers = md.packages_distributions()
    undeclared: dict[str, str] = {}
    for module, where in sorted(third_party_imports().items()):
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if not dists:
            undeclared[module] = f"no installed distribution provides it ({where[0]})"
        elif not dists & declared:
            names = ", ".join(sorted(dists))
            undeclared[module] = f"from {names}, imported at {', '.join(where)}"
    assert not undeclared, (
        "imported by app/ or tables/ but not declared in pyproject's dependencies (a range"
        f" holding constraints.txt's pin): {undeclared}"
    )
