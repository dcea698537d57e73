"""A Timer with some fields changed (`copied`) and a `TimerChange` of two Timers
(`change_of`), made as pydantic makes them but without its Python-level wrappers.

Every fired timer copies its row three times (the claim, the outcome, the settle) and
makes two or three changes of them (#20): `model_copy`'s `__copy__` copies the four slots
through `copy.copy` and `hasattr` (~1.5 µs a copy on the 2-core box, ~0.85 µs here), and
`TimerChange(...)` runs the validator, which only checks that both are Timers (~0.7 µs,
~0.4 µs here). Neither validates anything more: `model_copy` never validates an update,
and a Timer field is taken as it is (pydantic does not revalidate model instances).
`tests/unit/test_copies.py` holds them equal to pydantic's own, slot by slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tables.rowload import _model
from tables.timer import Timer, TimerChange

__all__ = ["change_of", "copied"]

_CHANGE_FIELDS = frozenset(TimerChange.model_fields)


def copied(timer: Timer, update: Mapping[str, Any]) -> Timer:
    """`timer.model_copy(update=update)`: the same fields, fields set and (empty) extras.
    As with `model_copy`, `update` is not validated: its values must be the fields' types."""
    # A Timer forbids extras and holds no private attributes: `_model` sets both None, as
    # pydantic copies them.
    made: Timer = _model(
        Timer, {**timer.__dict__, **update}, timer.__pydantic_fields_set__ | update.keys()
    )
    return made


def change_of(loaded: Timer, next: Timer) -> TimerChange:
    """`TimerChange(loaded=loaded, next=next)` of two Timers."""
    made: TimerChange = _model(TimerChange, {"loaded": loaded, "next": next}, set(_CHANGE_FIELDS))
    return made
