"""`observe_all` counts a batch of amounts into a histogram exactly as one `observe` each
would: the same buckets, count and sum (the sum to float rounding), for any amounts,
bounds included, on top of what the histogram held before."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from app.node.metrics import LATENESS_BUCKETS, observe_all

amounts = st.lists(
    st.one_of(
        st.sampled_from(LATENESS_BUCKETS),  # exactly on a bound: that bucket, as observe
        st.floats(min_value=-10.0, max_value=1e6, allow_nan=False),
    ),
    max_size=60,
)


def _histogram() -> Histogram:
    return Histogram(
        "h_seconds", "h", ["type"], buckets=LATENESS_BUCKETS, registry=CollectorRegistry()
    )


def _samples(h: Histogram) -> dict[tuple[str, str], float]:
    [metric] = h.collect()
    return {
        (s.name, s.labels.get("le", "")): s.value for s in metric.samples if "created" not in s.name
    }


@given(before=amounts, batch=amounts)
def test_the_same_as_observing_each(before: list[float], batch: list[float]) -> None:
    one_by_one, all_at_once = _histogram(), _histogram()
    for h in (one_by_one, all_at_once):
        h.labels("t")
        for amount in before:
            h.labels("t").observe(amount)
    for amount in batch:
        one_by_one.labels("t").observe(amount)
    observe_all(all_at_once.labels("t"), batch)

    expected, got = _samples(one_by_one), _samples(all_at_once)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if key[0].endswith("_sum"):
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9)
        else:
            assert got[key] == value, key


class _Other:
    """A histogram without prometheus_client's parts (another version's): observed one by
    one."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def observe(self, amount: float) -> None:
        self.seen.append(amount)


def test_a_histogram_without_the_parts_is_observed_one_by_one() -> None:
    other = _Other()
    observe_all(other, [0.5, 2.0])  # type: ignore[arg-type]
    assert other.seen == [0.5, 2.0]


def test_a_labelled_parent_refuses_as_observe_does() -> None:
    with pytest.raises(ValueError):
        observe_all(_histogram(), [1.0])
