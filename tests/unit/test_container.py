"""The image and the compose file, checked without a Docker engine: hadolint on the
Dockerfile (its binary ships in a wheel), and the structure an operator relies on (a
non-root user, a liveness HEALTHCHECK, a data volume; workers that wait for a healthy
broker and publish their pages)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    # Beside the Python running the tests (a worktree may run another tree's venv).
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_runs_as_a_user_of_its_own_with_a_data_volume_and_a_liveness_check() -> None:
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, flags=re.M)
    assert users and users[-1] not in ("root", "0"), "the last USER is not root"
    assert re.search(r'^VOLUME \["/data"\]$', DOCKERFILE, flags=re.M)
    assert "TICKWHEEL_DATA_DIR=/data" in DOCKERFILE
    [check] = re.findall(r"^HEALTHCHECK .*?\n(?:\s+CMD .*)$", DOCKERFILE, flags=re.M)
    assert "/livez" in check, "liveness: a broker outage must not make the container unhealthy"
    assert "-c constraints.txt" in DOCKERFILE, "the image installs the set CI tests"
    for needed in ("LICENSE", "constraints.txt"):
        assert re.search(rf"^COPY .*\b{re.escape(needed)}\b", DOCKERFILE, flags=re.M)


def test_workers_wait_for_a_healthy_broker_and_publish_their_pages() -> None:
    services = compose()["services"]
    assert services["kafka"]["healthcheck"]["test"]
    worker = services["worker"]
    assert worker["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert worker["environment"]["TICKWHEEL_WEB_PORT"] == "9400"
    assert worker["environment"]["TICKWHEEL_WEB_HOST"] == "0.0.0.0"
    # A range, so that `--scale worker=N` gives each its own host port, the first 9400.
    assert "9400-9409:9400" in worker["ports"]
    assert "volumes" not in worker, "a shared volume would put two workers' stores in one dir"
    demo = services["demo"]
    assert demo["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert demo["healthcheck"] == {"disable": True}


def test_the_monitoring_profile_provisions_the_dashboard_as_grafanas_home() -> None:
    services = compose()["services"]
    grafana = services["grafana"]
    assert grafana["profiles"] == ["monitoring"] == services["prometheus"]["profiles"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert (ROOT / mounted[home]).is_file()
