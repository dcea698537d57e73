"""An aggregate without events is folded from a dict of its own: a state type may keep
the dict it is validated from and an applier change it in place, and no aggregate's
state may then leak into the next new aggregate's (the empty aggregate is one shared
object, `_NO_EVENTS`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.model.aggregate import AggregateType, Event
from app.model.decide import _NO_EVENTS, fold
from app.protocol.wire import EventEnvelope
from tables import AggregateRef


class KeepsItsDict(BaseModel):
    """A state that keeps the very dict it is validated from (as a root model of `Any`,
    or a validator that stores its input, may)."""

    raw: dict[str, Any] = {}

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> KeepsItsDict:
        return cls.model_construct(raw=obj)

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(self.raw)


def marked(state: KeepsItsDict, event: Event) -> KeepsItsDict:
    state.raw[str(event.body["mark"])] = 1  # in place
    return state


def event(aggregate: str, mark: str) -> EventEnvelope:
    return EventEnvelope(
        id=f"{aggregate}/0",
        type="marked",
        aggregate=AggregateRef(context="shop", aggregate="box", id=aggregate),
        version=1,
        request_id=f"r-{aggregate}",
        created_at=1,
        body={"mark": mark},
    )


def test_a_new_aggregates_state_never_holds_another_new_ones() -> None:
    box = AggregateType("shop", "box", KeepsItsDict)
    box.applies("marked")(marked)
    x = fold(box, _NO_EVENTS, [event("x", "a")])
    y = fold(box, _NO_EVENTS, [event("y", "b")])
    assert x.state == {"a": 1}
    assert y.state == {"b": 1}
    assert _NO_EVENTS.state == {}
