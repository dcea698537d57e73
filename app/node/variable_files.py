"""An `X_FILE` variable's file read (`file_value`): a regular file alone, of at most
`MAX_FILE_BYTES` of UTF-8; and why a settings file could not be read (`unread_reason`).
May import `app.errors`."""

from __future__ import annotations

import os
import stat
from typing import Final

from app.errors import ConfigError

__all__ = ["MAX_FILE_BYTES", "file_value", "unread_reason"]

MAX_FILE_BYTES: Final = 64 * 1024
"""The most an `X_FILE` variable's file may hold: a secret, a token or any setting's value
is far smaller; a larger file is no such value (a log or an image named by mistake)."""


def file_value(path: str, name: str) -> str:
    """The stripped text of an `X_FILE` variable's file; `ConfigError` starting with `name`
    unless it is a regular file of at most `MAX_FILE_BYTES` of UTF-8.

    Only a regular file is opened: a FIFO's open blocks until a writer comes, and a device
    (`/dev/zero`, `/dev/urandom`) never ends. It is opened non-blocking and checked again
    once open (it may have been swapped since), and at most `MAX_FILE_BYTES` + 1 bytes are
    read whatever its size says (a file of /proc says 0): the start never hangs on it nor
    fills the memory with it."""

    def refused(why: str) -> ConfigError:
        return ConfigError(f"{name}: cannot read {path!r}: {why}")

    if "\x00" in path:  # a .env's (the environment holds none): os.stat raises ValueError
        raise refused("a NUL character in the path")
    try:
        if (kind := _not_regular(os.stat(path).st_mode)) is not None:
            raise refused(f"it is {kind}, not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if (kind := _not_regular(os.fstat(fd).st_mode)) is not None:
                raise refused(f"it is {kind}, not a regular file")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise refused(unread_reason(exc)) from exc
    if len(data) > MAX_FILE_BYTES:
        raise refused(
            f"it holds more than {MAX_FILE_BYTES} bytes, more than any setting's value (a "
            "secret, a token): name the file that holds the value alone"
        )
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise refused(unread_reason(exc)) from exc


_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str | None:
    """What a file of `mode` is when it is no regular file, else None."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "no regular file")


def unread_reason(exc: OSError | UnicodeDecodeError) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return f"not UTF-8 text ({exc.reason})"
