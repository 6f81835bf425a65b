"""What the receiver tests of the redis and memory drivers build their cases from."""

from __future__ import annotations

import time

from mega.drivers.base import Delivery, DlqRecord, Lane, Message


def group_lane(name: str, pattern: str) -> Lane:
    return Lane("group", name, pattern, 10, 30.0, 3600.0)


def message(
    job_id: str,
    subject: str,
    *,
    run_at_ms: int | None = None,
    dedup: bool = True,
    body: bytes = b'{"n":1}',
) -> Message:
    return Message(job_id, subject, body, int(time.time() * 1000), run_at_ms, dedup)


def record(delivery: Delivery, attempts: int) -> DlqRecord:
    return DlqRecord(
        id=delivery.id,
        subject=delivery.subject,
        payload={"n": 1},
        error={"type": "RuntimeError", "message": "boom"},
        attempts=attempts,
        first_enqueued_at=delivery.enqueued_at_ms,
        failed_at=int(time.time() * 1000),
        worker="test",
    )
