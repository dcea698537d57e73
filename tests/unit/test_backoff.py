"""The capped backoff (`app.backoff`): grows to its cap, never past it, and no step
overflows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.backoff import capped_backoff

HUGE = [10**6, 10**9, 10**400, 2**63]
STEPS = st.one_of(st.integers(), st.sampled_from([*HUGE, -(10**9), -(10**400)]))
# Within a few ulps of 1 a float power's rounding is as large as a step's growth.
MULTIPLIERS = st.one_of(st.just(1.0), st.just(2.0), st.floats(1.001, 100.0))
INITIALS = st.floats(0.0, 1e9)
CAPS = st.floats(0.0, 1e12)


@given(INITIALS, CAPS, MULTIPLIERS, STEPS, STEPS)
def test_the_backoff_grows_to_its_cap_and_never_raises(
    initial: float, cap: float, multiplier: float, step: int, other: int
) -> None:
    low, high = sorted((step, other))
    wait = capped_backoff(initial, cap, low, multiplier)
    assert 0.0 <= wait <= cap
    assert wait <= capped_backoff(initial, cap, high, multiplier)


@given(INITIALS, CAPS, MULTIPLIERS, st.integers(max_value=0))
def test_no_step_is_the_initial_wait(
    initial: float, cap: float, multiplier: float, step: int
) -> None:
    assert capped_backoff(initial, cap, step, multiplier) == min(initial, cap)


@pytest.mark.parametrize("step", HUGE)
def test_a_huge_step_is_the_cap(step: int) -> None:
    assert capped_backoff(0.5, 10.0, step) == 10.0
    assert capped_backoff(1000, 60_000, step, 1.0001) == 60_000.0
    assert capped_backoff(1000, 60_000, step, 1.0) == 1000.0


@pytest.mark.parametrize(
    ("initial", "cap", "multiplier"),
    [(-1.0, 10.0, 2.0), (1.0, -1.0, 2.0), (1.0, 10.0, 0.5), (float("nan"), 10.0, 2.0)],
)
def test_a_backoff_that_cannot_grow_is_refused(
    initial: float, cap: float, multiplier: float
) -> None:
    with pytest.raises(ValueError, match="no backoff grows"):
        capped_backoff(initial, cap, 3, multiplier)
