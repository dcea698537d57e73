"""The project around the code: compose file, README commands, CI script."""

from __future__ import annotations

from pathlib import Path

import yaml

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
    readme = (ROOT / "README.md").read_text()
    assert "docker compose up --build --scale worker=3" in readme


def test_readme_commands_are_the_scripts_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/run" in readme
    assert "./scripts/test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in ci
    for script in ("scripts/run", "scripts/test", ".ci/run", "scripts/kafka-local"):
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"
