"""mega.tracing: nothing without an SDK; with one, each message carries its context, a tick and
a pool task are spans, and the quick reading of a `traceparent` agrees with OpenTelemetry's."""

from __future__ import annotations

from typing import Any

import pytest

from mega import Context, Job, JobQueue, Schedule, Scheduler, tracing
from mega.testing import drain, memory_context, worker_pool
from tests.mega.test_testing import KitTasks

SEEN: list[dict[str, str] | None] = []


class Traced(Job):
    subject = "traced.one"
    bus = "jobs"

    async def run(self, payload: Any, ctx: Context) -> None:
        SEEN.append(tracing.carrier() if tracing.tracer() else None)


class Enqueues(Schedule):
    cron = "0 0 1 1 *"
    timezone = "UTC"

    async def run(self, ctx: Context) -> None:
        await JobQueue(ctx, "jobs").enqueue(Traced, {})


@pytest.fixture(autouse=True)
def clean() -> None:
    SEEN.clear()


def stored_traces(ctx: Context) -> list[Any]:
    broker = ctx.bus("jobs").broker  # type: ignore[attr-defined]
    return [message.trace for message in broker.subject(Traced.subject).ready]


async def test_without_an_sdk_nothing_is_traced_and_no_header_is_stored() -> None:
    assert tracing.tracer() is None
    ctx = memory_context()
    await JobQueue(ctx, "jobs").enqueue(Traced, {})
    assert stored_traces(ctx) == [None]
    with tracing.producing("send", "x", system="memory", ids=["a"]) as headers:
        assert headers is None
    with tracing.processing("x", system="memory", message_id="a", attempt=1, headers=None) as span:
        assert span is None


async def test_a_tick_is_the_parent_of_the_job_it_enqueues(spans: Any) -> None:
    ctx = memory_context()
    scheduler = Scheduler(ctx)
    scheduler.register(Enqueues)
    await scheduler.run_now("Enqueues")
    [trace] = stored_traces(ctx)
    assert set(trace) == {"traceparent"}
    await drain(ctx, jobs=[Traced])
    by_name = {span.name: span for span in spans.get_finished_spans()}
    tick, send, run = (
        by_name["tick Enqueues"],
        by_name["send traced.one"],
        by_name["process traced.one"],
    )
    assert tick.parent is None and tick.attributes["mega.source"] == "manual"
    assert send.parent.span_id == tick.context.span_id
    assert run.parent.span_id == send.context.span_id
    assert run.context.trace_id == tick.context.trace_id
    # The run's span is current while it runs: what it enqueued or logged would be its child.
    [inside] = SEEN
    assert inside is not None and f"{run.context.span_id:016x}" in inside["traceparent"]


async def test_a_pool_task_is_a_span(spans: Any) -> None:
    ctx = memory_context()
    async with worker_pool(KitTasks, ctx, mode="thread") as pool:
        assert await pool.run("add", {"a": 2, "b": 3}) == 5
    [span] = [s for s in spans.get_finished_spans() if s.name == "pool kit.add"]
    assert span.attributes["mega.task"] == "add"


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-977c9a0eca57bb14c44a770c3c69fc79-5717ee4cdd283536-01",
        "00-977c9a0eca57bb14c44a770c3c69fc79-5717ee4cdd283536-00",
        "00-977c9a0eca57bb14c44a770c3c69fc79-5717ee4cdd283536-03",
        "00-00000000000000000000000000000000-5717ee4cdd283536-01",  # invalid: no trace
        "01-977c9a0eca57bb14c44a770c3c69fc79-5717ee4cdd283536-01",  # a later version
        "00-977c9a0eca57bb14c44a770c3c69fc7z-5717ee4cdd283536-01",  # not hex
        "garbage",
    ],
)
def test_the_quick_traceparent_reading_agrees_with_the_propagator(traceparent: str) -> None:
    from opentelemetry import propagate
    from opentelemetry.trace import get_current_span

    headers = {"traceparent": traceparent}
    ours = get_current_span(tracing._context(headers)).get_span_context()
    theirs = get_current_span(propagate.extract(headers)).get_span_context()
    assert ours == theirs
