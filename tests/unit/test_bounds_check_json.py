"""`check_json`: its quick walk of plain JSON decides exactly as the full one does."""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tables.bounds import MAX_DEPTH, MAX_INT64, MIN_INT64, _check_json, check_json


class Level(IntEnum):
    HIGH = 3


class Text(str):
    pass


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=5),
    st.integers(MIN_INT64 - 2, MIN_INT64 + 2),
    st.integers(MAX_INT64 - 2, MAX_INT64 + 2),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([Level.HIGH, Text("t"), b"bytes", (1, 2), {1}, object()]),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 3) | st.none(), inner)
    ),
    max_leaves=20,
)


def _said(value: Any, depth: int = 0) -> str | None:
    """What `check_json` says of `value`, and that the full walk says the same."""
    try:
        check_json(value, "body", depth)
        quick = None
    except ValueError as exc:
        quick = str(exc)
    try:
        _check_json(value, "body", depth)
        full = None
    except ValueError as exc:
        full = str(exc)
    assert quick == full
    return quick


@given(_values, st.integers(0, MAX_DEPTH + 1))
def test_check_json_decides_and_says_as_the_full_walk(value: Any, depth: int) -> None:
    _said(value, depth)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"a": [1, {"b": MAX_INT64 + 1}]}, f"body.a.1.b: integer {MAX_INT64 + 1} is outside"),
        ({"a": math.inf}, "body.a: inf is not a finite number"),
        ({"a": [b"x"]}, "body.a.0: bytes is not JSON"),
        ({"a": {"b": (1,)}}, "body.a.b: tuple is not JSON"),
        # Written as "1", read back another body than the one decided with (a restore's
        # applier failed on it, its request id forgotten, and the request applied again).
        ({"m": {1: 100}}, "body.m: key 1 is not a string"),
        ({"m": [{None: 1}]}, "body.m.0: key None is not a string"),
        ({"a": Level.HIGH, "b": Text("t")}, None),
        ({"k": "v", "n": [1, 2.5, None, True, MIN_INT64]}, None),
    ],
)
def test_check_json_reasons(value: Any, reason: str | None) -> None:
    said = _said(value)
    if reason is None:
        assert said is None
    else:
        assert said is not None and said.startswith(reason)


def test_check_json_nesting_bound() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert _said(deep) is None
    said = _said([deep])
    assert said is not None and said.endswith(f"nested more than {MAX_DEPTH} deep")
