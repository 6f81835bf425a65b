"""The status writer's records, made without the model, read back as the model writes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mega.drivers.base import Delivery, Lane
from mega.lanes.records import ErrorInfo, JobStatus, as_attempt, decode, encode
from mega.lanes.status import Report, StatusWriter

LANE = Lane(
    kind="job",
    name="SendReceipt",
    subject="shop.receipt",
    concurrency=4,
    ack_wait_s=30,
    dlq_max_age_s=0,
    keep_status_s=86_400,
)
BOOM = ErrorInfo(type="RuntimeError", message='smtp said "no" \u2014 twice')


@pytest.mark.parametrize(
    ("state", "enqueued_at", "fields"),
    [
        ("running", 1_000, {"started_at": 2_000}),
        ("retrying", None, {"started_at": 2_000, "error": BOOM, "due_at": 9_000}),
        ("done", 1_000, {"started_at": 2_000, "finished_at": 2_005, "result_kept": True}),
        ("done", 1_000, {"started_at": 2_000, "finished_at": 2_005, "result_kept": False}),
        ("dlq", 1_000, {"started_at": None, "error": BOOM, "finished_at": 3_000}),
        ("cancelled", None, {"started_at": None, "error": None, "finished_at": 3_000}),
    ],
)
def test_a_record_made_without_the_model_is_the_models_own(
    state: Any, enqueued_at: int | None, fields: dict[str, Any]
) -> None:
    writer = StatusWriter(None, LANE, worker="worker@host:41:ab12cd")  # type: ignore[arg-type]
    report = Report(2, state, enqueued_at, fields)
    made = writer._record_json("order-7", report)
    model = writer._record("order-7", report)
    assert json.loads(made) == json.loads(encode(model))  # the same fields, defaults left out
    assert decode(made) == model


def test_an_attempt_still_running_when_the_next_starts_was_lost_with_its_worker() -> None:
    status = JobStatus(
        id="order-7",
        job="SendReceipt",
        state="running",
        attempts=1,
        started_at=2_000,
        worker="worker@host:41:ab12cd",
    )
    attempt = as_attempt(status)
    assert (attempt.attempt, attempt.state, attempt.worker) == (1, "lost", status.worker)
    retried = status.model_copy(update={"state": "retrying", "error": BOOM})
    assert (as_attempt(retried).state, as_attempt(retried).error) == ("retrying", BOOM)


def test_a_lane_that_keeps_no_status_records_keeps_no_report() -> None:
    delivery = Delivery(
        id="order-7",
        subject="shop.receipt",
        body=b"{}",
        attempt=1,
        enqueued_at_ms=1_000,
        run_at_ms=None,
        key=1,
        handle=None,
    )
    writer = StatusWriter(None, LANE, worker="w")  # type: ignore[arg-type]
    writer.on = False  # as for keep_status_s = 0
    writer.started(delivery, 2_000)
    assert writer._statuses == {}
