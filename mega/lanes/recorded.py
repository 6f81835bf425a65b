"""The stage of a job's status record (mega/lanes/stages.py): `Recorded`, around a job lane's
settles, writing through its `StatusWriter` (mega/lanes/status.py).

What it keeps true, whatever kills the worker and when:

- A run's start is recorded (`running`); a run after the first, which may be one that kills
  its worker again, has it stored before it runs, so the job's page shows each lost attempt as
  it happens.
- A job that ended (`done`, `cancelled`) has its record written at its ack, after every
  stage within (a workflow told that its step ended), and is acked once the record is stored,
  by the writer, after the batch that holds it (sent at once, with the records of the jobs
  that end meanwhile): the run's task ends now. A worker killed between the two leaves a job
  that runs again, never an acked one whose record says `running` for good, nor one whose
  record says `done` while its workflow was never told (a redelivery of a `done` job is acked
  unrun).
- A retry's `retrying`, and a dead letter's `failed`, are stored before the job is handed back
  or dead-lettered: the next run's records, perhaps another worker's, come after them (a late
  record of this run would replace theirs). Once the dead letter is stored the record says
  `dlq`; a worker killed in between leaves `failed`, which a read shows as `dlq` once it is
  FAILED_GRACE_S old and its dead letter is stored (`read_status`).
"""

from __future__ import annotations

from collections.abc import Awaitable

from mega.drivers.base import Delivery
from mega.lanes.stages import End, Settle, SettleNext
from mega.lanes.status import StatusWriter


class Recorded:
    """The stage that keeps each job's status record (see the module)."""

    def __init__(self, records: StatusWriter) -> None:
        self.records = records

    def begin(self, delivery: Delivery, started_ms: int) -> Awaitable[None] | None:
        self.records.started(delivery, started_ms)
        return self.records.sent() if delivery.attempt > 1 else None

    def settle(self, end: End, call_next: SettleNext) -> Awaitable[None]:
        if end.kind in ("done", "cancelled"):
            end.after = self._then_ack
            return call_next(end)
        return self._stored_first(end, call_next)

    def _then_ack(self, end: End, ack: Settle) -> Awaitable[None] | None:
        """At the ack of a job that ended: its record, then the ack once the record is
        stored (by the writer: None), or the ack itself when no record is kept."""
        records, delivery = self.records, end.delivery
        if end.kind == "done":
            records.done(delivery, end.started_ms or 0, end.result)
        else:
            records.ended(delivery, end.started_ms, "cancelled", None, attempts=end.attempts)
        if not records.on:
            return ack(delivery)
        records.then(ack, delivery)
        return None

    async def _stored_first(self, end: End, call_next: SettleNext) -> None:
        """A retry, a dead letter, a hand-back: their records stored before the settle."""
        records, delivery = self.records, end.delivery
        if end.kind == "retry":
            assert end.error is not None
            records.retrying(delivery, end.started_ms or 0, end.error, end.due_ms)
            await records.sent()  # a late `retrying` would hide the next run's `done`
        elif end.kind == "dead":
            records.ended(delivery, end.started_ms, "failed", end.error, attempts=end.attempts)
            await records.sent()
            await call_next(end)
            records.ended(delivery, end.started_ms, "dlq", end.error, attempts=end.attempts)
            return
        else:  # handed back: after this run's records, which the next run's come after
            await records.sent()
        await call_next(end)
