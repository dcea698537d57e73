"""The capped backoff (`app.backoff`) and the waits computed with it. A partition failing
every 10 s for three hours counts ~1100 failures in a row, and its retake's wait,
`0.5 * 2 ** 1098`, raised OverflowError in the partition task's fault path: no step
overflows now, and each caller's waits are those it had before wherever they did not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.backoff import capped_backoff
from app.kafka.oauth_token import INITIAL_BACKOFF_S, MAX_BACKOFF_S, backoff_s
from app.node.failing import RETAKE_BACKOFF_MAX_S, RETAKE_BACKOFF_S, Failing, retake_after
from app.node.partition_take import TAKE_ATTEMPTS, TAKE_BACKOFF_MAX_S, TAKE_BACKOFF_S, take_retry
from app.timers.runner.options import RetryPolicy, backoff_ms

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


@pytest.mark.parametrize("failures", [1100, 10**6, 10**9])
def test_a_partition_failing_for_hours_waits_the_longest_retake(failures: int) -> None:
    assert retake_after(Failing({}, "x", failures)) == RETAKE_BACKOFF_MAX_S


@pytest.mark.parametrize("waited", [1100, 10**6, 10**9])
def test_a_take_waiting_for_the_cluster_long_waits_the_longest_retake(waited: int) -> None:
    assert take_retry("cluster", 0, waited) == RETAKE_BACKOFF_MAX_S


# The waits as each caller computed them before (where those did not overflow): kept.


@given(st.integers(-5, 1000))
def test_the_waits_are_those_of_before(n: int) -> None:
    assert backoff_s(n) == (
        0.0 if n <= 0 else min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2.0 ** min(n - 1, 16))
    )
    assert retake_after(Failing({}, "x", n)) == (
        0.0 if n <= 1 else float(min(RETAKE_BACKOFF_MAX_S, RETAKE_BACKOFF_S * 2 ** (n - 2)))
    )
    assert take_retry("cluster", 0, n) == float(
        min(RETAKE_BACKOFF_MAX_S, TAKE_BACKOFF_S * 2 ** max(n, 1))
    )
    assert take_retry("counted", n, 0) == (
        None
        if n >= TAKE_ATTEMPTS
        else float(min(TAKE_BACKOFF_MAX_S, TAKE_BACKOFF_S * 2 ** max(n, 1)))
    )


@given(
    st.builds(
        RetryPolicy,
        initial_backoff_ms=st.integers(1, 10_000),
        multiplier=st.floats(1.0, 100.0),
        max_backoff_ms=st.integers(10_000, 7 * 86_400_000),
    ),
    st.one_of(st.integers(-5, 10_000), st.sampled_from(HUGE)),
)
def test_the_policys_waits_are_those_of_before(policy: RetryPolicy, failures: int) -> None:
    exponent = min(max(failures, 1) - 1, 64)
    before = policy.initial_backoff_ms * policy.multiplier**exponent
    assert backoff_ms(policy, failures) == int(min(before, policy.max_backoff_ms))


@pytest.mark.parametrize("failures", HUGE)
def test_the_oauth_backoff_after_hours_of_failures_is_ten_seconds(failures: int) -> None:
    assert backoff_s(failures) == MAX_BACKOFF_S
