"""The `tickwheel` command line: the composition root (a worker with its HTTP edge, the
demo, operators' commands on timers, jobs and the rebuild).

May import: anything in `app`.
"""

from app.cli.main import cli, main

__all__ = ["cli", "main"]
