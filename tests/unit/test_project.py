"""The project around the code: compose file, README commands, CI script; the docs' links,
the README's first screen, the docs' claims about scripts, schemas and benchmarks."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import kafka_broker  # registered by tests/conftest.py
import orjson
import pytest
import yaml
from pydantic import ValidationError

from app.errors import BadRecord
from app.protocol.schemas import SHIPPED_DIR, render_schemas, stale_schemas
from app.protocol.wire import SCHEDULE_SET, EventEnvelope, ScheduleSet, decode, encode
from app.timers.runner.options import TimerOptions
from tables.bounds import JSON_BOUNDS

ROOT = Path(__file__).resolve().parents[2]


def test_compose_parses_and_has_broker_workers_and_demo() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["worker"]["command"] == ["tickwheel", "worker"]
    assert services["demo"]["command"][:2] == ["tickwheel", "demo"]
    for name in ("worker", "demo"):
        env = services[name]["environment"]
        assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:19092"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "docker compose up --build --scale worker=3" in readme


def test_readme_commands_are_the_scripts_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/run" in readme
    assert "./scripts/test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in ci
    for script in ("scripts/run", "scripts/test", ".ci/run", "scripts/kafka-local"):
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"


# --- the docs: README.md, docs/*.md, bench/README.md ----------------------------------------

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's: lower case, punctuation
    dropped, spaces to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_stays_in_the_repository_and_finds_its_target(page: Path) -> None:
    for link in _links(page):
        assert "://" not in link and not link.startswith("mailto:"), f"{page.name}: {link}"
        target, _, anchor = link.partition("#")
        found = (page.parent / target).resolve() if target else page
        assert ROOT in found.parents or found == ROOT, f"{page.name}: {link} leaves the repo"
        assert found.exists(), f"{page.name}: {link} does not exist"
        if anchor:
            assert anchor in _anchors(found), f"{page.name}: {link}: no such heading"
    assert "../shared" not in page.read_text()


def test_the_readme_opens_with_what_it_is_for_whom_when_not_and_how_to_start() -> None:
    readme = (ROOT / "README.md").read_text()
    order = [
        "# Tickwheel\n",
        "**Who it is for:**",
        "**When not to use it:**",
        "## Quick start\n",
        "./scripts/run",
        "./scripts/test",
        "```python\n# mymodule.py",
        "## Contents\n",
    ]
    where = [readme.index(part) for part in order]
    assert where == sorted(where), "the first screen's parts, in this order"
    contents = readme.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    linked = {link.partition("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", contents)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"pages the contents do not list: {sorted(pages - linked)}"
    for name in ("Temporal", "APScheduler", "kcat", "Chromium", "root"):
        assert name in readme.split("## Contents\n", 1)[0], name


def test_the_docs_docker_compose_commands_name_what_the_compose_file_has() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    profiles = {p for s in compose["services"].values() for p in s.get("profiles", [])}
    found = [
        line for page in PAGES for line in re.findall(r"docker compose [^`\n]+", page.read_text())
    ]
    assert found
    for line in found:
        words = line.split()
        if "--profile" in words:
            assert words[words.index("--profile") + 1] in profiles, line
        if "--scale" in words:
            service = words[words.index("--scale") + 1].split("=")[0]
            assert service in compose["services"], line


def test_the_docs_kafka_local_lines_parse_as_the_script_parses_them() -> None:
    script = kafka_broker.load_kafka_local()
    lines = [
        match
        for page in PAGES
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S)
        for match in re.findall(r"scripts/kafka-local ([^|)\"\n]*)", block)
    ]
    assert len(lines) >= 2
    for line in lines:
        script.build_parser().parse_args(shlex.split(line))
    text = (ROOT / "docs" / "getting-started.md").read_text()
    assert f"Kafka {script.KAFKA_VERSION}'s jars" in text
    assert f"Kafka {script.KAFKA_VERSION} is pinned" in text


def test_the_demos_longer_run_is_the_variable_scripts_run_reads() -> None:
    assert "DEMO_SECONDS=40 ./scripts/run" in " ".join(
        (ROOT / "docs" / "getting-started.md").read_text().split()
    )
    assert "${DEMO_SECONDS:-25}" in (ROOT / "scripts" / "run").read_text()


def test_scripts_test_installs_kcat_and_chromium_only_as_root_as_the_docs_say() -> None:
    test = (ROOT / "scripts" / "test").read_text()
    assert "scripts/system-packages kcat:kcat chromium:chromium" in test
    packages = (ROOT / "scripts" / "system-packages").read_text()
    assert '"$(id -u)" != 0' in packages and "apt-get install" in packages
    readme = (ROOT / "README.md").read_text()
    assert "sudo apt-get install kcat chromium" in readme
    assert (
        "sudo apt-get install kcat chromium" in (ROOT / "docs" / "getting-started.md").read_text()
    )


# --- the schemas: one source (the models), a copy for readers and one in the wheel ----------


def test_the_package_ships_the_schemas_the_models_render() -> None:
    rendered = render_schemas()
    assert stale_schemas(SHIPPED_DIR) == [], (
        "run `tickwheel schemas --dir app/protocol/json_schemas`"
    )
    assert stale_schemas(ROOT / "docs" / "schemas") == [], "run `tickwheel schemas`"
    assert sorted(p.name for p in SHIPPED_DIR.iterdir()) == sorted(rendered)
    assert sorted(p.name for p in (ROOT / "docs" / "schemas").iterdir()) == sorted(rendered)
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = data["package-data"]["app"]
    shipped = SHIPPED_DIR.relative_to(ROOT / "app")
    for name in rendered:
        assert any(fnmatch.fnmatch(f"{shipped}/{name}", g) for g in globs), name


def test_unknown_fields_are_kept_at_the_top_of_an_envelope_and_refused_below_it() -> None:
    """As docs/wire-format.md says, and its schemas show."""
    closed = {"dead-letter-headers.schema.json", "timer.schema.json"}
    for name, text in render_schemas().items():
        schema = orjson.loads(text)
        kept = schema.get("additionalProperties")
        if name in closed:
            assert kept is False, name
        else:  # the schema that takes anything, saying the bounds JSON Schema cannot
            assert set(kept) == {"description"} and JSON_BOUNDS in kept["description"], name
        for part, sub in schema.get("$defs", {}).items():
            if sub.get("type") == "object":
                assert sub.get("additionalProperties") is False, (name, part)
    body: dict[str, Any] = {
        "key": "k",
        "rule": {"kind": "once", "at": 5},
        "command": {"type": "X"},
    }
    aggregate = {"context": "shop", "aggregate": "order", "id": "o-1"}
    event: dict[str, Any] = {
        "id": "e-1",
        "type": SCHEDULE_SET,
        "version": 1,
        "created_at": 0,
        "aggregate": aggregate,
        "body": body,
        "from_a_newer_writer": 1,
    }
    read = decode(EventEnvelope, orjson.dumps(event))
    assert orjson.loads(encode(read))["from_a_newer_writer"] == 1, "kept, and written back"
    assert ScheduleSet.model_validate({**body, "newer": 1})
    for part, value in [
        ("rule", {"kind": "once", "at": 5, "until": 9}),
        ("command", {"type": "X", "priority": 1}),
        ("target", {"context": "shop", "aggregate": "order", "id": "o", "region": "eu"}),
    ]:
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            ScheduleSet.model_validate({**body, part: value})
    with pytest.raises(BadRecord, match="aggregate"):
        decode(EventEnvelope, orjson.dumps({**event, "aggregate": {**aggregate, "x": 1}}))


# --- bench/README.md ------------------------------------------------------------------------


def test_the_bench_readme_gives_the_runners_defaults() -> None:
    text = " ".join((ROOT / "bench" / "README.md").read_text().split())
    said = text.split("timer options `{}` = the defaults (", 1)[1].split(")", 1)[0]
    defaults = TimerOptions()
    figures = {k: v for k, v in re.findall(r"`(\w+)` ([\d,]+)", said)}
    assert int(figures["batch_limit"].replace(",", "")) == defaults.batch_limit
    assert int(figures["max_in_flight"].replace(",", "")) == defaults.max_in_flight == 1000
    assert int(figures["poll_interval_ms"]) == defaults.poll_interval_ms
    assert f"`claim_timeout` {defaults.claim_timeout // 1000} s" in said
    assert f"`send_timeout` {defaults.send_timeout // 1000} s" in said
