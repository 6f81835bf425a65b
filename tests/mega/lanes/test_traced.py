"""mega/lanes/traced.py: each attempt in a consumer span from its start to its settle, a run
that raised ends it as an error, a retry's copy names it for the next attempt to link to; no
SDK, no span. Through the executor, against the recording receiver of test_executor.py."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from mega import tracing
from mega.errors import Permanent
from mega.lanes.stages import End, SettleNext, Stage
from mega.lanes.traced import Traced
from tests.mega.lanes.test_executor import Receiver, Signals, delivery, executor


def traced(receiver: Receiver, run: Any, signals: Signals, group: str | None = None) -> Any:
    return executor(receiver, run, signals, stages=[Traced(system="nats", group=group)])


class Ids:
    """A stage inside the tracing one: the span's ids at the settle (what a `done` line
    logged then carries)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str] | None] = []

    def settle(self, end: End, call_next: SettleNext) -> Awaitable[None]:
        self.seen.append(tracing.ids())
        return call_next(end)


async def test_a_done_attempt_is_one_consumer_span_around_its_settle(spans: Any) -> None:
    receiver, signals, ids = Receiver(), Signals(), Ids()

    async def run(payload: Any, _: Any) -> None:
        return None

    stages: list[Stage] = [Traced(system="nats", group="mailers"), ids]
    await executor(receiver, run, signals, stages=stages).process(delivery(1))
    [span] = spans.get_finished_spans()
    assert span.name == "process lanes.mail"
    assert span.kind.name == "CONSUMER"
    assert dict(span.attributes) == {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "lanes.mail",
        "messaging.message.id": "m1",
        "mega.attempt": 1,
        "messaging.consumer.group.name": "mailers",
    }
    assert span.status.status_code.name == "UNSET"
    context = span.get_span_context()
    assert ids.seen == [(f"{context.trace_id:032x}", f"{context.span_id:016x}")]
    assert receiver.calls == [("ack", "m1")]


async def test_a_failed_run_ends_its_span_as_an_error_and_its_retry_links_to_it(
    spans: Any,
) -> None:
    receiver, signals = Receiver(), Signals()
    first = delivery(1)

    async def run(payload: Any, _: Any) -> None:
        raise ValueError("the mail server said no")

    await traced(receiver, run, signals).process(first)
    [span] = spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert span.status.description == "ValueError: the mail server said no"
    assert [event.name for event in span.events] == ["exception"]
    context = span.get_span_context()
    assert first.trace is not None and set(first.trace) == {"mega-previous"}
    assert first.trace["mega-previous"].startswith(
        f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    )
    assert [call[0] for call in receiver.calls] == ["retry"]

    # The retry's attempt links to the one that failed.
    second_delivery = delivery(2)
    second_delivery.trace = first.trace
    await traced(receiver, run, signals).process(second_delivery)
    second = spans.get_finished_spans()[1]
    [link] = second.links
    assert link.context.span_id == context.span_id
    assert link.attributes == {"mega.attempt": 1}


async def test_a_dead_letter_ends_its_span_as_an_error_and_names_no_next_attempt(
    spans: Any,
) -> None:
    receiver, signals = Receiver(), Signals()
    last = delivery(1)

    async def run(payload: Any, _: Any) -> None:
        raise Permanent("no such address")

    await traced(receiver, run, signals).process(last)
    [span] = spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert last.trace is None
    assert [call[0] for call in receiver.calls] == ["dead_letter"]


async def test_without_an_sdk_an_attempt_has_no_span_and_its_end_passes_unchanged() -> None:
    assert tracing.tracer() is None
    receiver, signals, ids = Receiver(), Signals(), Ids()
    failing = delivery(1)

    async def run(payload: Any, _: Any) -> None:
        raise ValueError("down")

    stages: list[Stage] = [Traced(system="memory", group=None), ids]
    await executor(receiver, run, signals, stages=stages).process(failing)
    assert ids.seen == [None]
    assert failing.trace is None
    assert [call[0] for call in receiver.calls] == ["retry"]


async def test_an_sdk_set_up_after_the_lane_started_traces_the_attempts_after_it(
    spans: Any,
) -> None:
    from opentelemetry import trace

    receiver, signals = Receiver(), Signals()

    async def run(payload: Any, _: Any) -> None:
        return None

    lane = traced(receiver, run, signals)
    provider = trace.get_tracer_provider()
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]  # as before any SDK
    await lane.process(delivery(1))
    trace._TRACER_PROVIDER = provider  # type: ignore[attr-defined]
    await lane.process(delivery(1))
    assert len(spans.get_finished_spans()) == 1
