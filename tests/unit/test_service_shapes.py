"""A `Service` declared in a shape no worker could run is refused where it is declared,
naming the field; a list of types is taken. Before, `Service(aggregates=[order])` was
taken, then every worker and `rebuild` failed at the start with `unexpected TypeError: can
only concatenate list (not "tuple") to list`."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.model.aggregate import AggregateType
from app.service import Service


class _S(BaseModel):
    n: int = 0


order = AggregateType("shop", "order", _S)


def test_a_list_of_types_is_taken_as_a_tuple() -> None:
    service = Service(aggregates=[order])  # type: ignore[arg-type]
    assert service.aggregates == (order,)
    assert service.all_aggregates(12) == (order,)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"aggregates": order}, "aggregates: a tuple of AggregateType"),
        ({"aggregates": "shop.order"}, "aggregates: a tuple of AggregateType"),
        ({"aggregates": (order, "shop.cart")}, "'shop.cart' is not an AggregateType"),
        ({"aggregates": (), "jobs": ["shop"]}, "jobs: a mapping"),
        ({"aggregates": (), "jobs": {"shop": ["nightly"]}}, "'nightly' is not a Job"),
    ],
)
def test_a_shape_no_worker_could_run_is_refused_naming_the_field(
    kwargs: dict[str, Any], said: str
) -> None:
    with pytest.raises(TypeError, match=said):
        Service(**kwargs)
