"""A restore's row check takes a command and a rule equal to the last ones it took by a
compare of their bytes: only ever bytes its checks took, never a refused row's."""

from __future__ import annotations

import json

import pytest

from tables import AggregateRef, CommandSpec, IntervalRule, Timer, rowcheck
from tables.keys import encode_timer, index_key, row_key
from tables.rowcheck import _fast_index, restored_index

OWNER = AggregateRef(context="shop", aggregate="order", id="o-1")
GOOD = Timer(
    id="t", owner=OWNER, key="k", version=1, partition=0,
    rule=IntervalRule(start=10, every=5), target=OWNER,
    command=CommandSpec(type="Go", body={"n": 1}), slot_due_at=10, due_at=10,
)  # fmt: skip
KEY = row_key(OWNER, "k")


def _with(**fields: object) -> bytes:
    row = json.loads(encode_timer(GOOD))
    row.update(fields)
    return json.dumps(row, separators=(",", ":")).encode()


BAD_COMMAND = {"command": {"type": "Go", "body": {"n": 1}, "extra": 1}}  # no such field
BAD_RULE = {"rule": {"kind": "interval", "start": 10, "every": 5, "until": 3}}  # ends first


@pytest.mark.parametrize("bad", [BAD_COMMAND, BAD_RULE], ids=["command", "rule"])
def test_a_bad_command_or_rule_after_good_ones_is_refused_every_time(
    bad: dict[str, object],
) -> None:
    good = encode_timer(GOOD)
    assert _fast_index(0, KEY, good) == index_key(GOOD, KEY)
    for _ in range(2):  # the refused bytes are not taken as the last ones either
        assert _fast_index(0, KEY, _with(**bad)) is None
        with pytest.raises(ValueError):
            restored_index(0, KEY, _with(**bad))
    assert _fast_index(0, KEY, good) == index_key(GOOD, KEY)


def test_a_good_command_with_a_bad_rule_is_refused() -> None:
    """The command is taken by the compare, the rule still checked."""
    assert _fast_index(0, KEY, encode_timer(GOOD)) is not None
    assert _fast_index(0, KEY, _with(**BAD_RULE)) is None
    assert _fast_index(0, KEY, _with(**BAD_COMMAND)) is None


def test_an_id_with_a_nul_is_indexed_escaped() -> None:
    timer = GOOD.model_copy(update={"id": "a\x00b"})
    assert _fast_index(0, KEY, encode_timer(timer)) == index_key(timer, KEY)


def test_bytes_taken_are_kept_as_a_copy_not_a_view_of_the_callers_buffer() -> None:
    """A caller that hands a buffer and changes it after: the last command taken is still
    the one checked, so a bad command written into that buffer is checked, and refused."""
    rowcheck._last[:] = [None, None]  # taken from this buffer, not from an earlier test
    buffer = bytearray(encode_timer(GOOD))
    assert _fast_index(0, KEY, buffer) == index_key(GOOD, KEY)  # type: ignore[arg-type]
    at = buffer.index(b'{"n":1}')
    buffer[at : at + 7] = b"[1,222]"  # a body that is no object, of the same length
    assert _fast_index(0, KEY, bytes(buffer)) is None
