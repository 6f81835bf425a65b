"""backoff_delay_ms: exponential ceilings, full jitter, policy validation (pure, no broker)."""

from __future__ import annotations

import random

import pytest

from mega.lanes.backoff import BackoffPolicy, backoff_delay_ms

POLICY = {"type": "exponential", "initial": 500, "max": 2000}


class Extreme:
    """A fake random source that always answers the low or the high end."""

    def __init__(self, high: bool) -> None:
        self.high = high

    def randint(self, a: int, b: int) -> int:
        return b if self.high else a


@pytest.mark.parametrize(
    ("attempt", "ceiling_ms"),
    [
        (1, 500),  # first retry: up to `initial`
        (2, 1000),  # factor 2
        (3, 2000),
        (4, 2000),  # capped at `max`
        (50, 2000),
        (10_000, 2000),  # no overflow or slowness for absurd attempt numbers
        (0, 500),  # below 1 counts as the first attempt
        (-3, 500),
    ],
)
def test_ceiling_table(attempt: int, ceiling_ms: int) -> None:
    assert backoff_delay_ms(attempt, POLICY, Extreme(high=True)) == ceiling_ms
    assert backoff_delay_ms(attempt, POLICY, Extreme(high=False)) == 0  # full jitter: down to 0


@pytest.mark.parametrize("attempt", [1, 2, 3, 7])
def test_random_delays_stay_within_bounds_and_spread(attempt: int) -> None:
    rng = random.Random(attempt)
    ceiling = BackoffPolicy.parse(POLICY).ceiling_ms(attempt)
    delays = [backoff_delay_ms(attempt, POLICY, rng) for _ in range(2000)]
    assert all(0 <= d <= ceiling for d in delays)
    assert all(isinstance(d, int) for d in delays)
    # Full jitter spreads over the whole range, not a band around the ceiling.
    assert min(delays) < ceiling * 0.1
    assert max(delays) > ceiling * 0.9


def test_same_seed_same_delays() -> None:
    first = [backoff_delay_ms(3, POLICY, random.Random(7)) for _ in range(5)]
    second = [backoff_delay_ms(3, POLICY, random.Random(7)) for _ in range(5)]
    assert first == second


def test_policy_object_and_dict_agree() -> None:
    policy = BackoffPolicy.parse(POLICY)
    assert policy == BackoffPolicy(initial_ms=500, max_ms=2000)
    assert backoff_delay_ms(2, policy, Extreme(high=True)) == 1000
    assert BackoffPolicy.parse(policy) is policy


def test_type_may_be_omitted() -> None:
    assert BackoffPolicy.parse({"initial": 10, "max": 10}).ceiling_ms(5) == 10


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "linear", "initial": 1, "max": 2}, "type 'linear' is not supported"),
        ({"type": "exponential", "max": 2}, "initial must be a positive int"),
        ({"type": "exponential", "initial": 0, "max": 2}, "initial must be a positive int"),
        ({"type": "exponential", "initial": -5, "max": 2}, "initial must be a positive int"),
        ({"type": "exponential", "initial": 1.5, "max": 2}, "initial must be a positive int"),
        ({"type": "exponential", "initial": True, "max": 2}, "initial must be a positive int"),
        ({"type": "exponential", "initial": 10}, "max must be an int"),
        ({"type": "exponential", "initial": 10, "max": 5}, "max must be an int (ms) >= initial"),
        ({"type": "exponential", "initial": 10, "max": "20"}, "max must be an int"),
        ({"type": "exponential", "initial": 1, "max": 2, "factor": 3}, "unknown key(s) ['factor']"),
        ("exponential", "must be a dict"),
    ],
)
def test_invalid_policies_are_rejected(raw: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        backoff_delay_ms(1, raw)  # type: ignore[arg-type]
    assert message in str(caught.value)
