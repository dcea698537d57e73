"""A decision loads, dumps and stores a state through its model's validator and serializer
(#20: cheaper than pydantic's wrappers), but a state model with a `model_validate` or a
`model_dump` of its own is loaded and dumped by it, as before; and `json_copy` shares no
container with what it copies."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.model.aggregate import AggregateType, Command, Decision, Event, json_copy
from app.model.decide import StoredAggregate, decide
from app.protocol.wire import CommandEnvelope, ResultCode
from tables import AggregateRef

T0 = 1_700_000_000_000
REF = AggregateRef(context="shop", aggregate="counter", id="c-1")


class Migrated(BaseModel):
    """Reads an older shape (`n`) through its own `model_validate`."""

    count: int = 0

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Migrated:
        if isinstance(obj, dict) and "n" in obj:
            obj = {"count": obj["n"]}
        return super().model_validate(obj, *args, **kwargs)


class Tagged(BaseModel):
    """Writes one more field through its own `model_dump` (and ignores it when loaded)."""

    count: int = 0

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**super().model_dump(*args, **kwargs), "shape": 2}


def counter(state_type: type[Migrated] | type[Tagged]) -> AggregateType[Any]:
    agg: AggregateType[Any] = AggregateType("shop", "counter", state_type)

    @agg.command("shop.Count")
    def count(state: Any, cmd: Command, d: Decision) -> None:
        d.emit("shop.Counted", {"to": state.count + 1})

    @agg.applies("shop.Counted")
    def counted(state: Any, e: Event) -> Any:
        return state.model_copy(update={"count": e.body["to"]})

    return agg


def command() -> CommandEnvelope:
    return CommandEnvelope(request_id="r-1", type="shop.Count", aggregate=REF, issued_at=T0)


def test_a_state_models_own_model_validate_loads_it() -> None:
    stored = StoredAggregate(version=3, state={"n": 4})
    d = decide(counter(Migrated), stored, command(), now=T0, seen=False)
    assert d.code == ResultCode.COMMITTED, d.message
    assert d.events[0].body == {"to": 5}
    assert d.stored == StoredAggregate(version=4, state={"count": 5})


def test_a_state_models_own_model_dump_dumps_it() -> None:
    stored = StoredAggregate(version=1, state={"count": 1})
    d = decide(counter(Tagged), stored, command(), now=T0, seen=False)
    assert d.code == ResultCode.COMMITTED, d.message
    assert d.stored == StoredAggregate(version=2, state={"count": 2, "shape": 2})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


def containers(value: Any) -> list[Any]:
    found = [value] if type(value) in (dict, list) else []
    for item in value.values() if type(value) is dict else value if type(value) is list else ():
        found += containers(item)
    return found


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_copy_is_equal_and_shares_no_container(value: Any) -> None:
    copied = json_copy(value)
    assert copied == value
    assert type(copied) is type(value)
    originals = {id(c) for c in containers(value)}
    assert not originals & {id(c) for c in containers(copied)}
