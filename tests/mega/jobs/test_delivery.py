"""The consume loop's decision for one delivery, as a table: no broker, no clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mega.jobs.backoff import BackoffPolicy
from mega.jobs.delivery import (
    Ack,
    DeadLetter,
    Decision,
    Outcome,
    Retry,
    decide,
    is_unreported,
)


@dataclass(frozen=True)
class Policy:
    """What `decide` reads from a JobSpec: retries 2 (3 attempts), backoff 500..2000 ms."""

    max_attempts: int = 3
    backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(500, 2000))


class Highest:
    """A random source that always picks the top of the jitter range."""

    def randint(self, a: int, b: int) -> int:
        return b


@pytest.mark.parametrize(
    ("outcome", "attempt", "expected"),
    [
        (Outcome.SUCCEEDED, 1, Ack()),
        (Outcome.SUCCEEDED, 3, Ack()),  # the last try may succeed
        (Outcome.FAILED, 1, Retry(500)),  # ceilings double from `initial`...
        (Outcome.FAILED, 2, Retry(1000)),
        (Outcome.FAILED, 3, DeadLetter("failed")),  # ...until the tries run out
        (Outcome.UNDECODABLE, 1, DeadLetter("undecodable")),  # never worth a retry
        (Outcome.UNDECODABLE, 5, DeadLetter("undecodable")),
        (Outcome.PERMANENT, 1, DeadLetter("permanent")),  # tries left, skipped
        (Outcome.PERMANENT, 3, DeadLetter("permanent")),
        (Outcome.UNREPORTED, 4, DeadLetter("crashed")),  # attempt 3 killed its worker
        (Outcome.FAILED, 4, DeadLetter("crashed")),  # past the limit, whatever happened
    ],
)
def test_decision_table(outcome: Outcome, attempt: int, expected: Decision) -> None:
    assert decide(outcome, attempt, Policy(), Highest()) == expected


def test_retry_delay_is_jittered_within_the_ceiling() -> None:
    delays = set()
    for _ in range(200):
        decision = decide(Outcome.FAILED, 2, Policy())
        assert isinstance(decision, Retry)
        delays.add(decision.delay_ms)
    assert min(delays) >= 0 and max(delays) <= 1000 and len(delays) > 50


@pytest.mark.parametrize(("attempt", "unreported"), [(1, False), (3, False), (4, True), (9, True)])
def test_a_delivery_past_the_last_attempt_is_unreported(attempt: int, unreported: bool) -> None:
    assert is_unreported(attempt, Policy()) is unreported


def test_only_undecodable_messages_are_terminated() -> None:
    assert DeadLetter("undecodable").terminate
    assert not DeadLetter("failed").terminate and not DeadLetter("crashed").terminate


def test_no_retries_means_one_attempt() -> None:
    once = Policy(max_attempts=1)
    assert decide(Outcome.FAILED, 1, once) == DeadLetter("failed")
    assert decide(Outcome.UNREPORTED, 2, once) == DeadLetter("crashed")
