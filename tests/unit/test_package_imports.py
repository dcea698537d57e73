"""Each package of `app` says in its docstring what it may import ("May import: ..."), and
`tables` imports nothing of `app`: the tree is the architecture, so a module reaching past
its package's rule is a failing test, not a docstring gone stale. Checked on the source
(module-level and nested imports alike, `TYPE_CHECKING` ones included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for p in (ROOT / "app").glob("*/__init__.py"))


def rule_of(package: Path) -> str:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    found = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
    assert found is not None, f"{package.name}/__init__.py says nothing of what it may import"
    return " ".join(found.group(1).split())


def allowed_by(rule: str) -> set[str] | None:
    """The `app.x`, `tables` and `app` (the package root) a rule names; None: anything."""
    if rule.startswith("anything in `app`"):
        return None
    allowed = set(re.findall(r"`(app\.[a-z_]+|tables|app)`", rule.split("; never")[0]))
    return allowed


def imported(path: Path) -> list[tuple[int, str]]:
    """The first-party modules `path` imports, as the part a rule names (`app.x`,
    `tables`, `app` for the package root), with their lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "app" and node.level == 0:
            # The root's own names; its version alone is a leaf (the package's metadata).
            names = [f"app.{a.name}" if a.name == "__version__" else "app" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tables":
                found.append((node.lineno, "tables"))
            elif parts[0] == "app":
                found.append((node.lineno, "app" if len(parts) == 1 else f"app.{parts[1]}"))
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_a_package_imports_what_its_docstring_allows(package: Path) -> None:
    allowed = allowed_by(rule_of(package))
    if allowed is None:
        return
    own = f"app.{package.name}"
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {what}"
        for path in sorted(package.rglob("*.py"))
        for line, what in imported(path)
        if what not in allowed and what != own
    ]
    assert wrong == [], f"{own} may import {sorted(allowed)}"


def test_tables_and_the_shared_leaves_import_nothing_of_app() -> None:
    """`tables` is storage and its records; `app.errors`, `app.log_limit`, `app.task_ends`
    and `app.backoff` are leaves the packages share: none of them reaches up into `app`."""
    paths = [
        *sorted((ROOT / "tables").rglob("*.py")),
        ROOT / "app/errors.py",
        ROOT / "app/log_limit.py",
        ROOT / "app/task_ends.py",
        ROOT / "app/backoff.py",
    ]
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {what}"
        for path in paths
        for line, what in imported(path)
        if what != "tables"
    ]
    assert wrong == []


def test_the_rules_are_read_as_written() -> None:
    assert allowed_by(rule_of(ROOT / "app/timers")) == {
        "app.protocol",
        "app.kafka",
        "tables",
        "app.errors",
        "app.log_limit",
        "app.backoff",
    }
    # What a rule forbids is not what it allows.
    assert "app.ops" not in (allowed_by(rule_of(ROOT / "app/node")) or set())
    assert allowed_by(rule_of(ROOT / "app/cli")) is None
