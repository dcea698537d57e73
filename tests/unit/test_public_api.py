"""The public API is the package root, `app`: what the README, docs/ and examples/ import is
in its `__all__` and importable from it, and importing it costs a service no faust.

The docs' names are read from their code (README.md's and docs/'s ```python blocks,
examples/*.py, the demo): `from app import …` and `app.<name>` after `import app`. A name
they take from `tables` must be at the root as well, so that they can take it from there.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import app
import tables

ROOT = Path(__file__).resolve().parents[2]

PROMISED = frozenset(
    {
        # What a service author writes (README "Writing a service", "Scheduled jobs").
        "AggregateType",
        "Command",
        "Decision",
        "Event",
        "Service",
        "Job",
        "JobRun",
        "JobScope",
        "CommandSpec",
        "OnceRule",
        "IntervalRule",
        "CronRule",
        "AggregateRef",
        # Clients that keep no aggregate of their own (README "faust apps").
        "timer_book",
        "TickwheelTimers",
        "CommandEnvelope",
        "ResultCode",
    }
)
"""Names the root keeps whatever the docs happen to show today."""

IN_SIGNATURES = {
    # A parameter of public calls: `TickwheelTimers(replication=)`, `KafkaClients(...,
    # replication=)`, `ensure_topics(..., replication=)`.
    "Replication": "app.kafka.records",
    # What `node_topics` returns, and what `tail` and `read_partitions` yield.
    "TopicSpec": "app.kafka.records",
    "Record": "app.kafka.records",
    # What the docs name for a user to read or catch (docs/wire-format.md, docs/concepts.md).
    "DeadLetter": "app.protocol.dead_letters",
    "UserCodeTimeout": "app.model.user_code",
    "DecisionTooLarge": "app.model.aggregate",
}
"""Names a public call takes, returns or raises, and where they are made: at the root too,
so that no user imports them from the implementation's modules."""

FAUST_ONLY = frozenset({"TickwheelTimers"})
"""The names that need the faust extra (`request_id_for` needs none: app.clients.book_commands)."""


@dataclass
class Imports:
    """What one piece of code imports of `app` and `tables`."""

    root: set[str] = field(default_factory=set)
    """Names taken from the package root (`from app import X`, `app.X` after `import app`)."""
    submodules: set[str] = field(default_factory=set)
    """Modules under `app` imported directly (`app.model.aggregate`, …)."""
    tables: set[str] = field(default_factory=set)
    """Names taken from `tables` (or its modules)."""


def imports_of(code: str) -> Imports:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return _imports_by_pattern(code)
    found = Imports()
    aliases: set[str] = set()  # names bound to the root package by `import app [as x]`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {a.name for a in node.names}
            if node.module == "app":
                found.root |= names
            elif node.module.startswith("app."):
                found.submodules.add(node.module)
            elif node.module == "tables" or node.module.startswith("tables."):
                found.tables |= names
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "app":
                    aliases.add(a.asname or "app")
                elif a.name.startswith("app."):
                    found.submodules.add(a.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.root.add(node.attr)
    return found


def _imports_by_pattern(code: str) -> Imports:
    """For a block that is not a whole program (an excerpt that does not parse)."""
    found = Imports()
    pattern = r"^\s*from\s+([\w.]+)\s+import\s+(\([^)]*\)|[^\n]+)"
    for module, names in re.findall(pattern, code, flags=re.M):
        names = re.sub(r"#[^\n]*", "", names).strip().strip("()")
        listed = {n.split(" as ")[0].strip() for n in names.split(",")} - {""}
        if module == "app":
            found.root |= listed
        elif module.startswith("app."):
            found.submodules.add(module)
        elif module.split(".")[0] == "tables":
            found.tables |= listed
    found.submodules |= set(re.findall(r"^\s*import\s+(app\.[\w.]+)", code, flags=re.M))
    return found


def doc_blocks() -> list[tuple[str, str]]:
    """(where, code) of every ```python block of README.md and docs/**/*.md."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = []
    for path in docs:
        text = path.read_text()
        for n, code in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.S), 1):
            blocks.append((f"{path.relative_to(ROOT)} python block {n}", code))
    return blocks


def example_files() -> list[tuple[str, str]]:
    """(where, code) of the examples and the demo, which show the API as a user writes it."""
    paths = [*sorted((ROOT / "examples").glob("*.py")), ROOT / "app" / "demo" / "__init__.py"]
    return [(str(p.relative_to(ROOT)), p.read_text()) for p in paths]


SOURCES = doc_blocks() + example_files()


def test_the_sources_are_read() -> None:
    assert any(where.startswith("README.md") for where, _ in SOURCES)
    taken = {name for _, code in example_files() for name in imports_of(code).root}
    assert {"Service", "timer_book", "TickwheelTimers", "AggregateType"} <= taken


@pytest.mark.parametrize(("where", "code"), SOURCES, ids=[w for w, _ in SOURCES])
def test_every_name_the_docs_and_examples_take_from_app_is_exported(where: str, code: str) -> None:
    names = imports_of(code).root
    assert "*" not in names, f"{where}: `from app import *`; name what it uses"
    missing = names - set(app.__all__)
    assert not missing, f"{where} imports {sorted(missing)} from app, not in app.__all__"
    for name in names:
        getattr(app, name)


@pytest.mark.parametrize(("where", "code"), SOURCES, ids=[w for w, _ in SOURCES])
def test_what_the_docs_take_from_tables_the_root_exports_too(where: str, code: str) -> None:
    for name in imports_of(code).tables:
        assert name in app.__all__, f"{where} takes {name} from tables: export it from app"
        assert getattr(app, name) is getattr(tables, name)


@pytest.mark.parametrize(("where", "code"), example_files(), ids=[w for w, _ in example_files()])
def test_the_examples_and_the_demo_import_only_from_the_root(where: str, code: str) -> None:
    found = imports_of(code)
    assert not found.submodules, f"{where} imports {sorted(found.submodules)}: import from app"
    assert not found.tables, f"{where} imports {sorted(found.tables)} from tables: from app"


@pytest.mark.parametrize(("where", "code"), doc_blocks(), ids=[w for w, _ in doc_blocks()])
def test_the_docs_code_imports_no_module_under_app(where: str, code: str) -> None:
    """A reader copies what the docs show: only the root is kept from release to release."""
    found = imports_of(code)
    assert not found.submodules, f"{where} imports {sorted(found.submodules)}: import from app"


def test_every_name_in_all_resolves() -> None:
    assert len(app.__all__) == len(set(app.__all__)), "a name twice in app.__all__"
    assert set(app.__all__) <= set(dir(app))
    for name in app.__all__:
        assert getattr(app, name) is not None, name
    star: dict[str, object] = {}
    exec("from app import *", star)
    assert set(app.__all__) <= set(star)


def test_the_root_keeps_what_a_service_author_writes() -> None:
    assert set(PROMISED) - set(app.__all__) == set()


@pytest.mark.parametrize(("name", "module"), sorted(IN_SIGNATURES.items()))
def test_what_public_calls_take_return_or_raise_is_at_the_root(name: str, module: str) -> None:
    assert name in app.__all__
    assert getattr(app, name) is getattr(importlib.import_module(module), name)


def test_the_root_keeps_the_constants_and_errors_of_its_docstring() -> None:
    """The docstring lists what is exported; each name it lists is in `__all__`."""
    assert app.__doc__ is not None
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", app.__doc__))
    for name in (
        "SET_TIMER",
        "CANCEL_TIMER",
        "SCHEDULE",
        "TICKED",
        "SCHEDULE_SET",
        "SCHEDULE_CANCELLED",
        "AGGREGATE_DELETED",
        "BookState",
        "TickwheelError",
        *IN_SIGNATURES,
    ):
        assert name in listed, f"app's docstring does not name {name}"
        assert name in app.__all__, name
    missing = set(app.__all__) - listed - {"__version__"}
    assert not missing, f"app's docstring does not name {sorted(missing)}"


def test_the_kafka_types_are_loaded_on_first_use() -> None:
    out = python(
        "import json, sys\n"
        "import app\n"
        "before = 'app.kafka.records' in sys.modules\n"
        "app.Replication(factor=1, min_insync=1)\n"
        "print(json.dumps([before, 'app.kafka.records' in sys.modules]))\n"
    )
    assert json.loads(out) == [False, True]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'aggregate'"):
        app.__getattr__("aggregate")


def python(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (nothing imported yet)."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_app_imports_neither_faust_nor_the_kafka_client() -> None:
    out = python(
        "import json, sys\n"
        "import app\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('faust', 'mode', 'aiokafka'))))\n"
    )
    assert json.loads(out) == []


def test_without_faust_the_root_works_and_the_client_says_how_to_install_it() -> None:
    """`from app import *` and `hasattr` raised the extra's ImportError: the faust-only
    names are left out of `__all__` and `dir`, and are AttributeErrors saying how to
    install it (`from app import TickwheelTimers`: an ImportError, as for any name)."""
    out = python(
        "import json, sys\n"
        "sys.modules['faust'] = None  # as if the extra were not installed\n"
        "import app\n"
        f"faust_only = {sorted(FAUST_ONLY)!r}\n"
        "resolved = [n for n in app.__all__ if getattr(app, n) is not None]\n"
        "star = {}\n"
        "exec('from app import *', star)\n"
        "errors, has, listed = [], [], [n for n in faust_only if n in dir(app)]\n"
        "for name in faust_only:\n"
        "    has.append(hasattr(app, name))\n"
        "    try:\n"
        "        getattr(app, name)\n"
        "    except AttributeError as exc:\n"
        "        errors.append(str(exc))\n"
        "    try:\n"
        "        exec(f'from app import {name}', {})\n"
        "    except ImportError:\n"
        "        errors.append('ImportError')\n"
        "print(json.dumps({'resolved': resolved, 'star': sorted(set(star) - {'__builtins__'}),"
        " 'errors': errors, 'has': has, 'listed': listed}))\n"
    )
    result = json.loads(out)
    assert set(result["resolved"]) == set(result["star"]) == set(app.__all__) - FAUST_ONLY
    assert "request_id_for" in result["star"]
    assert (result["has"], result["listed"]) == ([False] * len(FAUST_ONLY), [])
    assert len(result["errors"]) == 2 * len(FAUST_ONLY)
    for message in result["errors"][::2]:
        assert "pip install '.[faust]'" in message
    assert set(result["errors"][1::2]) == {"ImportError"}


def test_faust_imported_before_the_root_is_found() -> None:
    """faust's module has no `__spec__`: `find_spec` raised ValueError on it."""
    out = python("import faust, app\nprint('TickwheelTimers' in app.__all__)\n")
    assert out.strip() == "True"


def test_with_faust_its_names_are_in_all() -> None:
    assert set(app.__all__) >= FAUST_ONLY
    assert set(dir(app)) >= FAUST_ONLY
    book_commands = importlib.import_module("app.clients.book_commands")
    assert app.request_id_for is book_commands.request_id_for
