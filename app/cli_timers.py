"""`tickwheel timers …`: operator commands on timers and the failure ledger."""

from __future__ import annotations

import typer

__all__ = ["timers_cli"]

timers_cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
