"""What the consume loop does with one delivery of a job: a pure decision, no broker.

    decide(outcome, attempt, spec) -> Ack() | Retry(delay_ms) | DeadLetter(kind)

`attempt` counts every delivery of the job (1-based), as the driver reports it (the engine's
delivery count plus the attempts a retry's copy carries), so it survives a worker crash: every
delivery is one attempt. The consume loop (`consumer.py`) turns the decision into calls of the
driver's receiver; `tests/mega/lanes/test_delivery.py` checks it as a table.

- SUCCEEDED: ack.
- FAILED with tries left (attempt < retries + 1): retry after the backoff (full jitter).
- FAILED on the last try: dead-letter, kind "failed".
- PERMANENT (the run raised `mega.Permanent` or one of the class's `permanent` errors): dead-
  letter at once, kind "permanent", whatever tries are left.
- UNDECODABLE (the body is not JSON): dead-letter at once, kind "undecodable", and terminate the
  message instead of acking it (nothing would ever decode it).
- INVALID (its id or key is not 1-200 printable characters without spaces: a message from a
  producer no check stood in front of, an older version or a foreign client): never run;
  dead-lettered at once under a stand-in id every engine can key (`stand_in_id`), kind
  "invalid", and terminated. Whatever a driver would build of such an id (a subject, a key, a
  header) could break an engine's limits: one poison message must cost one delivery.
- UNREPORTED, a delivery past retries + 1: the previous attempt never reported back, because
  the job killed its worker (segfault, os._exit, OOM kill). It is not run again: dead-letter,
  kind "crashed", instead of crash-looping the fleet.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Literal, Protocol

from mega.lanes.backoff import BackoffPolicy, RandomSource, backoff_delay_ms
from mega.lanes.ratelimit import RateLimit
from mega.validation import MAX_ID_LENGTH, is_token, shortened

if TYPE_CHECKING:
    from mega.drivers.base import Delivery

# The id a delivery with an unusable id is dead-lettered under: this + a digest of its id.
STAND_IN_PREFIX = "invalid-id-"


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PERMANENT = "permanent"
    UNDECODABLE = "undecodable"
    INVALID = "invalid"
    UNREPORTED = "unreported"


@dataclass(frozen=True)
class Ack:
    """Done: acknowledge the message."""


@dataclass(frozen=True)
class Retry:
    """Run it again after `delay_ms` (the next delivery is the next attempt)."""

    delay_ms: int


@dataclass(frozen=True)
class DeadLetter:
    """Publish a DLQ record, then settle the message: term it when `terminate`, else ack."""

    kind: Literal["failed", "permanent", "undecodable", "invalid", "crashed"]

    @property
    def terminate(self) -> bool:
        return self.kind in ("undecodable", "invalid")


Decision = Ack | Retry | DeadLetter


class RetryPolicy(Protocol):
    """How often and how patiently a job is retried (a `JobSpec` is one)."""

    @property
    def max_attempts(self) -> int: ...

    @property
    def backoff(self) -> BackoffPolicy: ...


class LanePolicy(RetryPolicy, Protocol):
    """What a consume loop needs of what it runs (a JobSpec, a ListenerSpec)."""

    @property
    def name(self) -> str: ...  # in signals: a job's name, a listener group
    @property
    def concurrency(self) -> int: ...
    @property
    def ack_wait_s(self) -> float: ...
    @property
    def timeout_s(self) -> float | None: ...  # a run's wall-clock limit
    @property
    def permanent(self) -> tuple[type[Exception], ...]: ...  # errors that skip the retries
    @property
    def rate_limit(self) -> RateLimit | None: ...  # starts per period, the whole group's
    @property
    def key_concurrency(self) -> int | None: ...  # runs of one key at once
    @property
    def flow_cache(self) -> str | None: ...  # the cache both count in


def is_unreported(attempt: int, policy: RetryPolicy) -> bool:
    """A delivery past the last attempt: the one before it never reported back."""
    return attempt > policy.max_attempts


def decide(
    outcome: Outcome, attempt: int, policy: RetryPolicy, rng: RandomSource = random
) -> Decision:
    """The decision for delivery number `attempt` (1-based) that ended in `outcome`."""
    if outcome is Outcome.SUCCEEDED:
        return Ack()
    if outcome is Outcome.UNDECODABLE:
        return DeadLetter("undecodable")
    if outcome is Outcome.INVALID:
        return DeadLetter("invalid")
    if outcome is Outcome.PERMANENT:
        return DeadLetter("permanent")
    if outcome is Outcome.UNREPORTED or is_unreported(attempt, policy):
        return DeadLetter("crashed")
    if attempt < policy.max_attempts:
        return Retry(backoff_delay_ms(attempt, policy.backoff, rng))
    return DeadLetter("failed")


def refusal(delivery: Delivery) -> str | None:
    """Why a delivery must not be run, its id or its key being unusable (see INVALID), or
    None. Checked on every delivery, so the usual case costs two cheap string tests."""
    key = delivery.flow_key
    if not is_token(delivery.id):
        what, value, kept = "id", delivery.id, "under a stand-in id"
    elif key is not None and not is_token(key):
        what, value, kept = "key", key, "without it"
    else:
        return None
    return (
        f"its {what} is not 1-{MAX_ID_LENGTH} printable characters without spaces "
        f"({shortened(value, 40)}), so no engine could be trusted to key it: not run, and kept "
        f"here {kept} (published by a producer that did not check it?)"
    )


def stand_in_id(value: str) -> str:
    """The id an unusable one is dead-lettered under: the same for each of its deliveries, so
    a redelivery's record dedups."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return STAND_IN_PREFIX + digest
