"""`tables.copies` makes what pydantic makes (#20): a copy with fields changed, as
`model_copy` does, and a `TimerChange`, as its constructor does, slot by slot."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from test_rowcheck import timers

from tables import AggregateRef, CommandSpec, OnceRule, Outcome, Timer, TimerChange, TimerStatus
from tables.copies import change_of, copied
from tables.keys import encode_timer
from tables.rowload import load_timer


def _slots(model: BaseModel) -> tuple[object, ...]:
    return (
        type(model),
        model.__dict__,
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


updates: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(TimerStatus),
        "due_at": st.integers(0, 2**40),
        "attempts": st.integers(0, 10),
        "outcome": st.sampled_from([None, *Outcome]),
        "error_code": st.sampled_from([None, "BUSY"]),
        "error_text": st.sampled_from([None, "refused"]),
    },
)


@given(timers, updates, st.booleans())
def test_a_copy_is_model_copys(timer: Timer, update: dict[str, Any], stored: bool) -> None:
    """The same slots as `model_copy` leaves, of a Timer built or loaded from a row (whose
    fields set differ), and the original untouched."""
    if stored:
        timer = load_timer(encode_timer(timer))
    before = _slots(timer)
    made, expected = copied(timer, update), timer.model_copy(update=update)
    assert _slots(made) == _slots(expected)
    assert made == expected and made.__dict__ is not timer.__dict__
    assert made.__pydantic_fields_set__ is not timer.__pydantic_fields_set__
    assert _slots(timer) == before
    assert encode_timer(made) == encode_timer(expected)


@given(timers, updates)
def test_a_change_is_timer_changes(timer: Timer, update: dict[str, Any]) -> None:
    nxt = copied(timer, update)
    made, expected = change_of(timer, nxt), TimerChange(loaded=timer, next=nxt)
    assert _slots(made) == _slots(expected)
    assert made == expected
    assert made.loaded is timer and made.next is nxt


def test_what_they_make_stays_frozen() -> None:
    owner = AggregateRef(context="shop", aggregate="order", id="o-1")
    timer = Timer(
        id="t-1",
        owner=owner,
        key="remind",
        version=1,
        partition=0,
        rule=OnceRule(at=5),
        target=owner,
        command=CommandSpec(type="Remind"),
        slot_due_at=5,
        due_at=5,
    )
    made = copied(timer, {"attempts": 1})
    with pytest.raises(ValueError, match="frozen"):
        made.attempts = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="frozen"):
        change_of(timer, made).next = timer  # type: ignore[misc]
