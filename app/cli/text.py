"""How the commands show text they did not write: a value given on the command line that
an error repeats, a string a record read from a topic holds. It reaches the terminal as
one line with nothing in it that the terminal acts on (a newline, a carriage return, an
escape sequence that moves the cursor or retitles the window), and an error line repeats
a long value's start and its length, not all of it (a 100,000-character `--owner` made a
line of 100 KB).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

__all__ = ["LONGEST_ERROR", "SHOWN", "error_line", "given_values", "printable"]

SHOWN = 80
"""How many characters of a long value an error line repeats."""
LONGEST_ERROR = 1_000
"""An error line's most characters: past it (a value repeated in a form `error_line` does
not know: changed, a part of it; a variable's, a broker's text) its middle is left out."""
_HEAD, _TAIL = 600, 300

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 and C1 control characters and DEL, and the line and paragraph separators (a line
break to `str.splitlines` and to some viewers)."""

_GIVEN: ContextVar[tuple[str, ...]] = ContextVar("tickwheel_given", default=())


def _escape(found: re.Match[str]) -> str:
    code = ord(found[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with its control characters written as `\\xNN` (`\\u2028`, `\\u2029` for the
    separators), tabs and newlines too: one line, or one column of a tab-separated line."""
    return _CONTROL.sub(_escape, text)


@contextlib.contextmanager
def given_values(args: Sequence[str]) -> Iterator[None]:
    """While it lasts, `error_line` cuts the long values of `args` (a command line, whose
    `--name=value` is two values) wherever a message repeats them."""
    values: set[str] = set()
    for arg in args:
        name, eq, value = arg.partition("=")
        values.update((name, value) if arg.startswith("--") and eq else (arg,))
    # The longest first: a shorter value may be part of a longer one.
    token = _GIVEN.set(tuple(sorted((v for v in values if len(v) > SHOWN), key=len, reverse=True)))
    try:
        yield
    finally:
        _GIVEN.reset(token)


def _forms(value: str) -> Iterator[tuple[str, str]]:
    """How a message may repeat `value`, each with its cut: as it is, and inside the quotes
    of `repr` (`{value!r}`, click's and pydantic's too) and of JSON."""
    head = value[:SHOWN]
    more = f"…({len(value)} characters)"
    yield value, head + more
    yield repr(value)[1:-1], repr(head)[1:-1] + more
    yield (
        json.dumps(value, ensure_ascii=False)[1:-1],
        json.dumps(head, ensure_ascii=False)[1:-1] + more,
    )


def error_line(message: str) -> str:
    """`error: <message>` as one line: the long values of the command line (`given_values`)
    it repeats cut to their first `SHOWN` characters and their length, its control
    characters escaped (`printable`), and its middle left out past `LONGEST_ERROR`."""
    for value in _GIVEN.get():
        for whole, cut in _forms(value):
            message = message.replace(whole, cut)
    line = "error: " + printable(message)
    if len(line) > LONGEST_ERROR:
        left_out = len(line) - _HEAD - _TAIL
        line = f"{line[:_HEAD]}…({left_out} characters left out)…{line[-_TAIL:]}"
    return line
