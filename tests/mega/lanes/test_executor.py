"""mega/lanes/executor.py: one delivery from its body to its settle, against a receiver that
records what it is asked (the contract suite proves the same on every driver's own receiver:
tests/mega/jobs/test_contract.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import pytest

from mega import Job
from mega.drivers.base import Delivery, DlqRecord, DriverUnavailable
from mega.jobs.spec import validate_job
from mega.lanes.executor import Executor
from mega.lanes.middleware import Middleware
from mega.lanes.stages import End, SettleNext, Stage


class Mailer(Job):
    subject = "lanes.mail"
    bus = "jobs"
    retries = 1
    backoff = {"type": "exponential", "initial": 1000, "max": 1000}

    async def run(self, payload: Any, ctx: Any) -> None:
        return None


POLICY = validate_job(Mailer, {"jobs"})  # two attempts at most
Signals = list[tuple[str, dict[str, Any]]]


class Receiver:
    """A receiver that says what it was asked, in order; `refuse_dead_letters` makes a dead
    letter's store an outage."""

    def __init__(self, *, refuse_dead_letters: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse_dead_letters = refuse_dead_letters

    async def ack(self, delivery: Delivery) -> None:
        self.calls.append(("ack", delivery.id))

    async def retry(self, delivery: Delivery, *, due_ms: int, attempts: int) -> None:
        self.calls.append(("retry", delivery.id, attempts, due_ms))

    async def release(self, delivery: Delivery, *, delay_s: float) -> None:
        self.calls.append(("release", delivery.id, delay_s))

    async def dead_letter(self, delivery: Delivery, record: DlqRecord, *, terminate: bool) -> None:
        if self.refuse_dead_letters:
            raise DriverUnavailable("the DLQ is not there")
        self.calls.append(("dead_letter", delivery.id, record, terminate))

    async def fetch(self, limit: int) -> list[Delivery]:
        return []

    def wake(self) -> None:
        return None

    async def extend(self, delivery: Delivery) -> None:
        return None

    async def close(self) -> None:
        return None


def delivery(attempt: int, body: bytes = b'{"to": "ada"}', key: int = 1) -> Delivery:
    return Delivery("m1", "lanes.mail", body, attempt, 1_000, None, key, None)


def executor(
    receiver: Receiver,
    run: Any,
    signals: Signals,
    middlewares: Sequence[Middleware] = (),
    stages: Sequence[Stage] = (),
    heard: frozenset[str] | None = None,
) -> Executor:
    """An executor whose signals go to `signals`; with `heard`, only those names have
    observers (None: every one has)."""

    async def signal(name: str, **fields: Any) -> None:
        signals.append((name, fields))

    return Executor(
        receiver,
        POLICY,
        run,
        signal,
        instance_id="w1",
        group=None,
        middlewares=middlewares,
        stages=stages,
        observed=(lambda name: True) if heard is None else heard.__contains__,
    )


async def test_a_run_that_returns_is_acked_once_and_said_done() -> None:
    seen: list[Any] = []

    async def run(payload: Any, _delivery: Delivery) -> str:
        seen.append(payload)
        return "sent"

    receiver = Receiver()
    signals: Signals = []
    await executor(receiver, run, signals).process(delivery(1))
    assert seen == [{"to": "ada"}]
    assert receiver.calls == [("ack", "m1")]
    assert [name for name, _ in signals] == ["start", "done"]


async def test_a_start_and_a_done_that_nobody_hears_are_not_sent_and_the_rest_are() -> None:
    async def run(payload: Any, _delivery: Delivery) -> None:
        if payload == {"to": "bob"}:
            raise RuntimeError("smtp down")

    receiver = Receiver()
    signals: Signals = []
    quiet = executor(receiver, run, signals, heard=frozenset())
    await quiet.process(delivery(1))
    await quiet.process(delivery(1, body=b'{"to": "bob"}', key=2))
    # No start nor done; a retry, as any other signal, goes to `signal`, which asks itself.
    assert [name for name, _ in signals] == ["retry"]
    assert [call[0] for call in receiver.calls] == ["ack", "retry"]

    signals.clear()
    heard = executor(Receiver(), run, signals, heard=frozenset({"start", "done"}))
    await heard.process(delivery(1))
    assert [(name, fields["id"]) for name, fields in signals] == [("start", "m1"), ("done", "m1")]
    assert signals[0][1]["latency_ms"] >= 0 and signals[1][1]["duration_ms"] >= 0


async def test_a_failure_with_tries_left_goes_back_for_the_backoffs_end() -> None:
    async def run(payload: Any, _delivery: Delivery) -> None:
        raise RuntimeError("smtp down")

    receiver = Receiver()
    signals: Signals = []
    before_ms = int(time.time() * 1000)
    await executor(receiver, run, signals).process(delivery(1))
    [(what, job_id, attempts, due_ms)] = receiver.calls
    assert (what, job_id, attempts) == ("retry", "m1", 1)
    assert before_ms <= due_ms <= int(time.time() * 1000) + 1000  # full jitter up to 1 s
    assert [name for name, _ in signals] == ["start", "retry"]
    assert signals[-1][1]["error"] == "smtp down"


async def test_the_last_failure_is_dead_lettered_with_its_error_and_attempts() -> None:
    async def run(payload: Any, _delivery: Delivery) -> None:
        raise RuntimeError("smtp down")

    receiver = Receiver()
    signals: Signals = []
    await executor(receiver, run, signals).process(delivery(2))
    [(what, job_id, record, terminate)] = receiver.calls
    assert (what, job_id, terminate) == ("dead_letter", "m1", False)
    assert record["error"] == {"type": "RuntimeError", "message": "smtp down"}
    assert (record["attempts"], record["payload"], record["worker"]) == (2, {"to": "ada"}, "w1")
    assert [name for name, _ in signals] == ["start", "fail", "dlq"]


async def test_a_body_that_is_not_json_is_dead_lettered_unrun_and_terminated() -> None:
    ran: list[Any] = []

    async def run(payload: Any, _delivery: Delivery) -> None:
        ran.append(payload)

    receiver = Receiver()
    signals: Signals = []
    await executor(receiver, run, signals).process(delivery(1, body=b"\xff not json"))
    [(what, _, record, terminate)] = receiver.calls
    assert (what, terminate, ran) == ("dead_letter", True, [])
    assert record["error"]["type"] == "DecodeError" and record["payload"] is None
    assert "raw_b64" in record


async def test_a_dead_letter_not_stored_goes_back_and_its_redelivery_stores_it() -> None:
    async def run(payload: Any, _delivery: Delivery) -> None:
        raise RuntimeError("smtp down")

    receiver = Receiver(refuse_dead_letters=True)
    signals: Signals = []
    lane = executor(receiver, run, signals)
    await lane.process(delivery(2))
    assert receiver.calls == [("release", "m1", lane.dlq_retry_delay_s)]
    assert [s["phase"] for name, s in signals if name == "fail"] == ["run", "dlq_publish"]
    # The redelivery is past the last attempt: not run again, its remembered record stored.
    receiver.refuse_dead_letters = False
    signals.clear()
    await lane.process(delivery(3))
    [(what, _, record, _)] = receiver.calls[1:]
    assert what == "dead_letter"
    assert (record["error"]["message"], record["attempts"]) == ("smtp down", 2)
    assert [name for name, _ in signals] == ["dlq"]


async def test_a_delivery_past_its_last_attempt_that_left_nothing_is_a_crash() -> None:
    async def run(payload: Any, _delivery: Delivery) -> None:
        raise AssertionError("never run again")

    receiver = Receiver()
    signals: Signals = []
    await executor(receiver, run, signals).process(delivery(3))
    [(what, _, record, _)] = receiver.calls
    assert what == "dead_letter" and record["error"]["type"] == "WorkerCrashed"
    assert record["attempts"] == 2 and "attempt 2 of 2 never reported back" in json.dumps(record)


@pytest.mark.parametrize("attempt", [1, 2])
async def test_a_middleware_sees_the_run_the_executor_makes(attempt: int) -> None:
    seen: list[tuple[str, str, int]] = []

    async def middleware(run: Any, call_next: Any) -> Any:
        seen.append((run.name, run.kind, run.attempt))
        return await call_next(run)

    async def run(payload: Any, _delivery: Delivery) -> None:
        return None

    receiver = Receiver()
    await executor(receiver, run, [], [middleware]).process(delivery(attempt))
    assert seen == [("Mailer", "job", attempt)] and receiver.calls == [("ack", "m1")]


class Seen:
    """A stage that writes each End it sees into the receiver's calls, before the settle."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    async def begin(self, delivery: Delivery, started_ms: int) -> None:
        self.receiver.calls.append(("begin", delivery.id))

    async def settle(self, end: End, call_next: SettleNext) -> None:
        self.receiver.calls.append(("stage", end.kind, end.attempts))
        await call_next(end)


@pytest.mark.parametrize(
    ("attempt", "fails", "settle"),
    [(1, False, "ack"), (1, True, "retry"), (2, True, "dead_letter")],
)
async def test_each_end_goes_through_the_stages_before_its_settle(
    attempt: int, fails: bool, settle: str
) -> None:
    async def run(payload: Any, _delivery: Delivery) -> None:
        if fails:
            raise RuntimeError("smtp down")

    receiver = Receiver()
    await executor(receiver, run, [], stages=[Seen(receiver)]).process(delivery(attempt))
    kind = {"ack": "done", "retry": "retry", "dead_letter": "dead"}[settle]
    assert [call[:3] if call[0] == "stage" else call[0] for call in receiver.calls] == [
        "begin",
        ("stage", kind, attempt),
        settle,
    ]


async def test_a_dead_letter_not_stored_goes_back_through_the_stages() -> None:
    async def run(payload: Any, _delivery: Delivery) -> None:
        raise RuntimeError("smtp down")

    receiver = Receiver(refuse_dead_letters=True)
    lane = executor(receiver, run, [], stages=[Seen(receiver)])
    await lane.process(delivery(2))
    assert receiver.calls == [
        ("begin", "m1"),
        ("stage", "dead", 2),
        ("stage", "back", 2),
        ("release", "m1", lane.dlq_retry_delay_s),
    ]
