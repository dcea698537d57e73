"""The one exception tree of the service layer."""

from __future__ import annotations

__all__ = ["BadRecord", "ConfigError", "TickwheelError"]


class TickwheelError(Exception):
    """Root of every error raised by `app`."""


class BadRecord(TickwheelError, ValueError):
    """A record on a topic that cannot be read: it is dead-lettered and skipped."""


class ConfigError(TickwheelError, ValueError):
    """A setting with a bad value; the message names the setting."""
