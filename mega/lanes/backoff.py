"""Retry delays: exponential backoff with full jitter, as a pure function.

    delay before try n+1 = uniform(0, min(max, initial * 2 ** (n - 1)))   (ms)

Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter") spreads the retries of
jobs that failed together, such as a whole batch hitting the same outage, so they do not come
back as a thundering herd at the same instant. No I/O here: the job queue calls it with the
attempt that just failed, and the tests call it with a seeded `random.Random`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from mega.validation import is_int

# The only backoff type the spec defines; others are rejected at register().
EXPONENTIAL = "exponential"
# Each failed attempt doubles the ceiling of the next delay.
FACTOR = 2
# 2**62 ms is beyond any `max`; capping the exponent keeps huge attempt numbers cheap.
MAX_EXPONENT = 62
POLICY_KEYS = frozenset({"type", "initial", "max"})


class RandomSource(Protocol):
    """What `backoff_delay_ms` needs from a random generator (the `random` module fits)."""

    def randint(self, a: int, b: int) -> int: ...


@dataclass(frozen=True)
class BackoffPolicy:
    """A validated exponential policy: the first ceiling `initial_ms`, never above `max_ms`."""

    initial_ms: int
    max_ms: int

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | BackoffPolicy) -> BackoffPolicy:
        """Validate a Job's `backoff` dict; raises ValueError naming the key at fault.

        `{"type": "exponential", "initial": ms, "max": ms}`: `initial` a positive int,
        `max` an int >= `initial`; unknown keys and other types are rejected.
        """
        if isinstance(raw, BackoffPolicy):
            return raw
        if not isinstance(raw, Mapping):
            raise ValueError(f"must be a dict like {{'type': 'exponential', ...}}, got {raw!r}")
        unknown = set(raw) - POLICY_KEYS
        if unknown:
            raise ValueError(f"unknown key(s) {sorted(unknown)}; allowed: {sorted(POLICY_KEYS)}")
        kind = raw.get("type", EXPONENTIAL)
        if kind != EXPONENTIAL:
            raise ValueError(f"type {kind!r} is not supported; use 'exponential'")
        initial = raw.get("initial")
        if not is_int(initial) or initial <= 0:
            raise ValueError(f"initial must be a positive int (ms), got {initial!r}")
        ceiling = raw.get("max")
        if not is_int(ceiling) or ceiling < initial:
            raise ValueError(f"max must be an int (ms) >= initial ({initial}), got {ceiling!r}")
        return cls(initial_ms=initial, max_ms=ceiling)

    def ceiling_ms(self, attempt: int) -> int:
        """The upper bound of the delay after failed attempt `attempt` (1-based), in ms."""
        exponent = min(max(attempt, 1) - 1, MAX_EXPONENT)
        growth: int = FACTOR**exponent
        return min(self.max_ms, self.initial_ms * growth)


def backoff_delay_ms(
    attempt: int,
    policy: BackoffPolicy | Mapping[str, Any],
    rng: RandomSource = random,
) -> int:
    """Milliseconds to wait after failed attempt `attempt` (1 = the first try) before the next.

    Uniform in [0, min(max, initial * 2 ** (attempt - 1))], both ends included. Attempts below 1
    are treated as 1. Raises ValueError for an invalid policy.
    """
    delay_ms: int = rng.randint(0, BackoffPolicy.parse(policy).ceiling_ms(attempt))
    return delay_ms
