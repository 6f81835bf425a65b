"""The testing chapter's worked example (docs/guide/testing.md): an app's own Job, Listener
and Schedule, unit-tested with mega.testing. No servers, no real sleeps; the guide runs it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from mega import Context, Event, EventBus, Job, JobQueue, Listener, ReceivedEvent, Schedule
from mega.testing import drain, failing, memory_context, planned_ticks, run_tick

SENT: list[str] = []


class SendReceipt(Job):
    subject = "shop.receipt"
    bus = "jobs"
    retries = 3
    backoff = {"type": "exponential", "initial": 30_000, "max": 300_000}  # minutes: never slept

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        SENT.append(payload["order"])


class OrderPaid(Event):
    name = "shop.order_paid"
    bus = "jobs"


class ReceiptOnPayment(Listener):
    event = OrderPaid

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        await JobQueue(ctx, "jobs").enqueue(SendReceipt, {"order": event.data["order"]})


class NightlyTotals(Schedule):
    cron = "0 30 2 * * *"  # 02:30:00 every day (six fields: seconds first)
    timezone = "America/New_York"

    async def run(self, ctx: Context) -> None:
        SENT.append(f"totals {self.tick.instant:%Y-%m-%d}")


def setup_function() -> None:
    SENT.clear()


async def test_a_paid_order_sends_one_receipt_after_two_failures() -> None:
    ctx = memory_context("jobs")
    await EventBus(ctx, "jobs").emit(OrderPaid, {"order": "A-1"})
    with failing(SendReceipt, times=2):  # the mail server is down twice
        report = await drain(ctx, jobs=[SendReceipt], listeners=[ReceiptOnPayment])
    assert report.count("SendReceipt", "retry") == 2
    assert report.count("SendReceipt", "done") == 1
    assert SENT == ["A-1"]


async def test_a_receipt_that_always_fails_ends_in_the_dlq() -> None:
    ctx = memory_context("jobs")
    queue = JobQueue(ctx, "jobs")
    await queue.enqueue(SendReceipt, {"order": "B-2"})
    with failing(SendReceipt, times=10, error=ConnectionError("smtp down")):
        report = await drain(ctx, jobs=[SendReceipt])
    assert report.count("SendReceipt", "dlq") == 1
    [record] = await queue.dlq.list(SendReceipt)
    assert record["attempts"] == 4  # retries + 1
    assert record["error"]["type"] == "ConnectionError"


def test_the_nightly_totals_skip_the_spring_forward_gap() -> None:
    ticks = planned_ticks(NightlyTotals, datetime(2024, 3, 9, tzinfo=UTC), days=3)
    days = [tick.astimezone(ZoneInfo("America/New_York")).day for tick in ticks]
    assert days == [9, 11]  # 02:30 does not exist on March 10 in New York


async def test_one_night_runs_with_its_planned_instant() -> None:
    instant = datetime(2024, 3, 9, 7, 30, tzinfo=UTC)
    tick = await run_tick(NightlyTotals, memory_context(), instant, fence=7)
    assert SENT == ["totals 2024-03-09"] and tick.fence == 7
