"""The consume loop's decision for one delivery, as a table: no broker, no clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mega.drivers.base import Delivery
from mega.lanes.backoff import BackoffPolicy
from mega.lanes.delivery import (
    Ack,
    DeadLetter,
    Decision,
    Outcome,
    Retry,
    decide,
    is_unreported,
    refusal,
    stand_in_id,
)
from mega.validation import is_token


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


def delivery(job_id: str, flow_key: str | None = None) -> Delivery:
    return Delivery(job_id, "s", b"{}", 1, None, None, key=1, handle=None, flow_key=flow_key)


def test_a_delivery_whose_id_or_key_is_no_token_is_refused_and_never_run() -> None:
    assert refusal(delivery("order-17", "tenant-a")) is None
    assert refusal(delivery("x" * 200)) is None
    too_long = refusal(delivery("p" * 5000))
    assert too_long is not None and too_long.startswith("its id is not 1-200 printable")
    assert "(5,000 characters)" in too_long and len(too_long) < 400
    spaced = refusal(delivery("ok", "two words"))
    assert spaced is not None and spaced.startswith("its key is not") and "without it" in spaced
    assert decide(Outcome.INVALID, 0, Policy()) == DeadLetter("invalid")
    assert DeadLetter("invalid").terminate  # nothing would ever make it runnable


def test_a_stand_in_id_is_a_token_and_the_same_for_every_delivery() -> None:
    first = stand_in_id("p" * 5000)
    assert first == stand_in_id("p" * 5000) != stand_in_id("p" * 4999)
    assert is_token(first) and first.startswith("invalid-id-") and len(first) == 43
    assert is_token(stand_in_id("line\r\nX-Forged: 1\ud800"))  # any text, even unpaired
