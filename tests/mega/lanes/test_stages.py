"""mega/lanes/stages.py, recorded.py and steps.py: the stages around a settle, each against
fakes that write down what they are asked, in one shared order (the contract suite proves
the same through every driver: tests/mega/jobs/test_contract.py)."""

from __future__ import annotations

import logging
from typing import Any, Literal

import pytest

from mega.drivers.base import Delivery, DriverUnavailable
from mega.lanes.recorded import Recorded
from mega.lanes.records import ErrorInfo
from mega.lanes.stages import End, SettleNext, Stage, beginnings, chain
from mega.lanes.steps import StepReports

BOOM = ErrorInfo(type="RuntimeError", message="smtp down")
Calls = list[tuple[Any, ...]]


def delivery(attempt: int = 1, job_id: str = "m1") -> Delivery:
    return Delivery(job_id, "lanes.mail", b"{}", attempt, 1_000, None, 1, None)


def settled(calls: Calls) -> SettleNext:
    """The innermost settle: writes down the End it was given."""

    async def settle(end: End) -> None:
        calls.append(("settle", end.kind, end.delay_s))

    return settle


class Records:
    """A StatusWriter that writes down each report, each wait for its batch and each ack
    handed to it (which it calls at once, as a stored batch does)."""

    def __init__(self, calls: Calls, *, on: bool = True) -> None:
        self.calls = calls
        self.on = on

    def started(self, delivery: Delivery, started_ms: int) -> None:
        self.calls.append(("record", "running", started_ms))

    def done(self, delivery: Delivery, started_ms: int, result: Any) -> None:
        self.calls.append(("record", "done", result))

    def retrying(self, delivery: Delivery, started_ms: int, error: ErrorInfo, due_ms: int) -> None:
        self.calls.append(("record", "retrying", due_ms))

    def ended(
        self,
        delivery: Delivery,
        started_ms: int | None,
        state: str,
        error: ErrorInfo | None,
        *,
        attempts: int | None = None,
    ) -> None:
        self.calls.append(("record", state, attempts))

    async def sent(self) -> None:
        self.calls.append(("stored",))

    def then(self, settle: Any, delivery: Delivery) -> None:
        self.calls.append(("ack once stored", delivery.id))


class Steps:
    """A workflow's StepEnds that writes down each report; `refuse` makes it an outage."""

    id_prefix = "wf-"

    def __init__(self, calls: Calls, *, refuse: bool = False) -> None:
        self.calls = calls
        self.refuse = refuse

    async def ended(
        self,
        job_id: str,
        state: Literal["done", "dlq", "cancelled"],
        *,
        result: Any = None,
        error: ErrorInfo | None = None,
        attempts: int = 1,
    ) -> None:
        if self.refuse:
            raise DriverUnavailable("the workflow's store is not there")
        self.calls.append(("step", job_id, state, result, attempts))


# -- the chain --------------------------------------------------------------------------------


class Named:
    def __init__(self, name: str, calls: Calls) -> None:
        self.name = name
        self.calls = calls

    async def settle(self, end: End, call_next: SettleNext) -> None:
        self.calls.append((self.name, "before"))
        await call_next(end)
        self.calls.append((self.name, "after"))


async def test_the_first_stage_is_the_outermost_and_the_settle_the_innermost() -> None:
    calls: Calls = []
    stages: list[Stage] = [Named("a", calls), Named("b", calls)]
    await chain(stages, settled(calls))(End("done", delivery(), 1.0))
    assert calls == [
        ("a", "before"),
        ("b", "before"),
        ("settle", "done", 0.0),
        ("b", "after"),
        ("a", "after"),
    ]


def test_only_the_stages_that_have_a_begin_begin() -> None:
    calls: Calls = []
    recorded = Recorded(Records(calls))  # type: ignore[arg-type]
    steps = StepReports(Steps(calls), name="Mailer", delay_s=5)
    assert beginnings([steps, recorded]) == (recorded.begin,)


# -- the status record --------------------------------------------------------------------------


@pytest.mark.parametrize(("attempt", "waits"), [(1, False), (2, True)])
async def test_a_run_after_the_first_has_its_start_stored_before_it_runs(
    attempt: int, waits: bool
) -> None:
    calls: Calls = []
    waiting = Recorded(Records(calls)).begin(delivery(attempt), 5_000)  # type: ignore[arg-type]
    assert (waiting is not None) is waits  # only a run after the first waits
    if waiting is not None:
        await waiting
    assert calls == [("record", "running", 5_000), *([("stored",)] if waits else [])]


@pytest.mark.parametrize("kind", ["done", "cancelled"])
async def test_an_ended_jobs_record_is_written_at_its_ack_and_the_ack_waits_for_it(
    kind: Any,
) -> None:
    calls: Calls = []
    end = End(kind, delivery(), 1.0, result="sent", attempts=1)
    await Recorded(Records(calls)).settle(end, settled(calls))  # type: ignore[arg-type]
    assert calls == [("settle", kind, 0.0)]  # the stages within first (a workflow told)
    assert end.after is not None
    assert end.after(end, _no_ack) is None  # the writer acks, once the record is stored
    record = ("record", "done", "sent") if kind == "done" else ("record", "cancelled", 1)
    assert calls[1:] == [record, ("ack once stored", "m1")]


async def test_without_records_an_ended_job_is_acked_at_once() -> None:
    calls: Calls = []
    end = End("done", delivery(), 1.0)
    await Recorded(Records(calls, on=False)).settle(end, settled(calls))  # type: ignore[arg-type]
    assert end.after is not None
    acked: list[str] = []

    async def ack(delivery: Delivery) -> None:
        acked.append(delivery.id)

    waiting = end.after(end, ack)
    assert waiting is not None  # the ack itself, to await: no batch to wait for
    await waiting
    assert acked == ["m1"] and ("ack once stored", "m1") not in calls


async def test_a_done_steps_workflow_is_told_before_its_record_says_done() -> None:
    calls: Calls = []
    stages: list[Stage] = [
        Recorded(Records(calls)),  # type: ignore[arg-type]
        StepReports(Steps(calls), name="Mailer", delay_s=5),
    ]

    async def innermost(end: End) -> None:  # as the executor's: the stage's work, then the ack
        assert end.after is not None
        waiting = end.after(end, _no_ack)
        if waiting is not None:
            await waiting

    await chain(stages, innermost)(End("done", delivery(1, "wf-1"), 1.0, result=3))
    assert calls == [
        ("step", "wf-1", "done", 3, 1),
        ("record", "done", 3),
        ("ack once stored", "wf-1"),
    ]


async def test_a_dead_steps_record_says_failed_before_its_workflow_is_told() -> None:
    calls: Calls = []
    stages: list[Stage] = [
        Recorded(Records(calls)),  # type: ignore[arg-type]
        StepReports(Steps(calls), name="Mailer", delay_s=5),
    ]
    end = End("dead", delivery(2, "wf-1"), 1.0, error=BOOM, attempts=2)
    await chain(stages, settled(calls))(end)
    assert calls == [
        ("record", "failed", 2),
        ("stored",),
        ("step", "wf-1", "dlq", None, 2),
        ("settle", "dead", 0.0),
        ("record", "dlq", 2),
    ]


async def test_a_retry_is_recorded_and_stored_before_the_job_goes_back() -> None:
    calls: Calls = []
    end = End("retry", delivery(), 1.0, error=BOOM, due_ms=9_000)
    await Recorded(Records(calls)).settle(end, settled(calls))  # type: ignore[arg-type]
    assert calls == [("record", "retrying", 9_000), ("stored",), ("settle", "retry", 0.0)]


async def test_a_dead_letter_is_failed_before_its_store_and_dlq_after() -> None:
    calls: Calls = []
    end = End("dead", delivery(2), 1.0, error=BOOM, attempts=2)
    await Recorded(Records(calls)).settle(end, settled(calls))  # type: ignore[arg-type]
    assert calls == [
        ("record", "failed", 2),
        ("stored",),
        ("settle", "dead", 0.0),
        ("record", "dlq", 2),
    ]


async def test_a_dead_letter_whose_store_fails_stays_failed() -> None:
    calls: Calls = []

    async def refused(end: End) -> None:
        raise DriverUnavailable("the DLQ is not there")

    end = End("dead", delivery(2), 1.0, error=BOOM, attempts=2)
    with pytest.raises(DriverUnavailable):
        await Recorded(Records(calls)).settle(end, refused)  # type: ignore[arg-type]
    assert calls == [("record", "failed", 2), ("stored",)]


async def test_a_job_handed_back_goes_after_its_records_are_stored() -> None:
    calls: Calls = []
    end = End("done", delivery(), 1.0).handed_back(5.0)
    await Recorded(Records(calls)).settle(end, settled(calls))  # type: ignore[arg-type]
    assert calls == [("stored",), ("settle", "back", 5.0)]


# -- a workflow's step --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["done", "cancelled", "retry", "dead"])
async def test_a_job_that_is_no_step_passes_through(kind: Any) -> None:
    calls: Calls = []
    stage = StepReports(Steps(calls), name="Mailer", delay_s=5)
    await stage.settle(End(kind, delivery(), 1.0, error=BOOM), settled(calls))
    assert calls == [("settle", kind, 0.0)]


@pytest.mark.parametrize(("kind", "state"), [("done", "done"), ("cancelled", "cancelled")])
async def test_a_steps_workflow_is_told_before_the_step_is_settled(kind: Any, state: str) -> None:
    calls: Calls = []
    stage = StepReports(Steps(calls), name="Mailer", delay_s=5)
    result = 42 if kind == "done" else None
    await stage.settle(End(kind, delivery(3, "wf-1"), 1.0, result=result), settled(calls))
    assert calls == [("step", "wf-1", state, result, 3), ("settle", kind, 0.0)]


async def test_a_step_whose_workflow_cannot_be_told_is_handed_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: Calls = []
    stage = StepReports(Steps(calls, refuse=True), name="Mailer", delay_s=5)
    with caplog.at_level(logging.WARNING, logger="mega.jobqueue"):
        await stage.settle(End("done", delivery(1, "wf-1"), 1.0), settled(calls))
    assert calls == [("settle", "back", 5)]
    assert "its workflow could not be told" in caplog.text and "runs again in 5 s" in caplog.text


async def test_a_step_handed_back_goes_through_every_stage_after_its_records_are_stored() -> None:
    calls: Calls = []
    stages: list[Stage] = [
        Recorded(Records(calls)),  # type: ignore[arg-type]
        StepReports(Steps(calls, refuse=True), name="Mailer", delay_s=5),
    ]
    await chain(stages, settled(calls))(End("done", delivery(1, "wf-1"), 1.0))
    # Not acked, not recorded done: this run's records stored, then the step handed back.
    assert calls == [("stored",), ("settle", "back", 5)]


async def test_a_dead_steps_report_goes_out_with_its_dead_letter() -> None:
    calls: Calls = []
    stage = StepReports(Steps(calls), name="Mailer", delay_s=5)
    await stage.settle(End("dead", delivery(2, "wf-1"), 1.0, error=BOOM), settled(calls))
    assert calls == [("step", "wf-1", "dlq", None, 2), ("settle", "dead", 0.0)]
    # A report that fails fails the dead letter's settle: both are tried again.
    refused = StepReports(Steps([], refuse=True), name="Mailer", delay_s=5)
    with pytest.raises(DriverUnavailable):
        await refused.settle(End("dead", delivery(2, "wf-1"), 1.0, error=BOOM), settled(calls))


async def _no_ack(delivery: Delivery) -> None:
    return None
