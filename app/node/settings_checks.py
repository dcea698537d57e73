"""Checks of single settings' values, as plain functions raising `ValueError` (the
settings' validators call them, and pydantic names the variable). May import
`app.kafka.addresses` alone."""

from __future__ import annotations

from pathlib import Path

from app.kafka.addresses import has_invisible

__all__ = ["a_directory", "printable"]


def printable(value: str) -> str:
    """`value` with no space, control or invisible character, at most 200 characters:
    said at start (a NUL cuts librdkafka's transactional id short, and a web host the
    server cannot bind fails only after the node joined its group)."""
    if has_invisible(value):
        raise ValueError("no space, control or invisible character")
    if len(value) > 200:
        raise ValueError("at most 200 characters")
    return value


def a_directory(value: Path) -> Path:
    """`value` if it can be a data directory: said before anything connects, not as an OS
    error at the lock's open."""
    text = str(value)
    if not text.strip() or text != text.strip():
        raise ValueError("a directory path, with no blank around it")
    if "\x00" in text:
        raise ValueError("a NUL character in the path")
    try:
        a_file = value.exists() and not value.is_dir()
    except OSError:  # not searchable by this user, a name too long: the lock says so
        return value
    if a_file:
        raise ValueError("it is a file, not a directory")
    return value
