"""The benchmarks' traced worker wraps the runtime's methods by name: a renamed or moved
method must fail here, not in a benchmark run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_traced_worker_finds_every_method_it_times() -> None:
    # In a process of its own: installing the wrappers patches the runtime's classes.
    code = "import bench.traced_worker as t; t.install(); print('ok')"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
