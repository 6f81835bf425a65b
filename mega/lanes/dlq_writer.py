"""What a lane does with a delivery it dead-letters: `DlqWriter` makes its DLQ record
(mega/lanes/dlq.py), stores it through the lane's stages and only then settles the delivery
(the receiver does both: `store`), and remembers, by the message's key, a record whose store
failed: the delivery is handed back, and its redelivery (past the last attempt) stores the
remembered record, with the real error, instead of calling it a crash. Nothing is lost, and
the driver's dedup keeps a record stored twice single.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from mega.drivers.base import Delivery, DlqRecord, DriverUnavailable, MessageTooLarge, Receiver
from mega.lanes.delivery import DeadLetter, Decision, LanePolicy
from mega.lanes.dlq import make_record
from mega.lanes.records import ErrorInfo
from mega.lanes.stages import End, SettleNext

# Error messages in signals and DLQ records are cut to this many characters.
MAX_ERROR_CHARS = 2000
# DLQ records whose store failed, kept so the redelivery carries the real error.
UNREPORTED_MEMO_SIZE = 1024

Signal = Callable[..., Awaitable[None]]


class DlqWriter:
    """What one lane in this process dead-letters (see the module): `spec` names the lane
    in signals, `signal(name, **fields)` reports each (`dlq`, or a `fail` of phase
    `dlq_publish` when the store failed), `instance_id` names this process in each record,
    `delay_s` is how long a delivery whose record was not stored waits to come back."""

    def __init__(
        self, spec: LanePolicy, signal: Signal, *, instance_id: str, delay_s: float
    ) -> None:
        self.spec = spec
        self.signal = signal
        self.instance_id = instance_id
        self.delay_s = delay_s
        self.unreported: OrderedDict[Hashable, DlqRecord] = OrderedDict()

    def record(
        self,
        delivery: Delivery,
        payload: Any,
        error_type: str,
        error: str,
        attempts: int,
        raw: bytes | None = None,
    ) -> DlqRecord:
        """The DLQ record of `delivery`: its payload (or, undecodable, its `raw` body), the
        error, the runs it had (`attempts`) and this process as its worker."""
        return make_record(
            delivery.subject,
            delivery.id,
            payload,
            error_type,
            error,
            attempts=attempts,
            first_enqueued_at=delivery.enqueued_at_ms,
            worker=self.instance_id,
            raw=raw,
            flow_key=delivery.flow_key,
        )

    def remembered(self, delivery: Delivery) -> DlqRecord | None:
        """The record an earlier delivery of this message could not store, if any."""
        return self.unreported.get(delivery.key)

    async def letter(
        self,
        settle: SettleNext,
        decision: Decision,
        delivery: Delivery,
        record: DlqRecord,
        started: float | None = None,
        exc: BaseException | None = None,
    ) -> None:
        """Store `record` and settle `delivery` as `decision` says, through `settle` (the
        lane's stages, then the bus). If the store fails, or a stage's part of it, the
        delivery is handed back after `delay_s` and the record remembered.

        Args:
            settle: the lane's settle, through its stages.
            decision: the dead letter decided for the delivery.
            delivery: the delivery to dead-letter.
            record: its DLQ record.
            started: when its run started (epoch s), None when it never ran.
            exc: what its run raised, None when it did not run or did not raise.
        """
        assert isinstance(decision, DeadLetter), decision  # the others are settled inline
        failure = ErrorInfo(type=record["error"]["type"], message=record["error"]["message"])
        end = End(
            "dead",
            delivery,
            started,
            attempts=record["attempts"],
            error=failure,
            exc=exc,
            record=record,
            terminate=decision.terminate,
        )
        try:
            await settle(end)
        except DriverUnavailable as exc:
            self.unreported[delivery.key] = record
            while len(self.unreported) > UNREPORTED_MEMO_SIZE:
                self.unreported.popitem(last=False)
            await settle(end.handed_back(self.delay_s))
            cause = exc.__cause__ or exc
            await self.signal(
                "fail",
                job=self.spec.name,
                id=record["id"],
                attempt=record["attempts"],
                phase="dlq_publish",
                error_type=type(cause).__name__,
                error=(str(cause) or repr(cause))[:MAX_ERROR_CHARS],
            )
            return
        self.unreported.pop(delivery.key, None)
        await self.signal(
            "dlq",
            job=self.spec.name,
            id=record["id"],
            attempts=record["attempts"],
            error_type=record["error"]["type"],
            error=record["error"]["message"],
        )


async def store(receiver: Receiver, delivery: Delivery, record: DlqRecord, terminate: bool) -> None:
    """The record, and then the settle; a record over the engine's message cap (a payload near
    it, with the error beside it) is stored without its payload instead: kept for ever
    unstored, it would come back and fail the same way each time."""
    try:
        await receiver.dead_letter(delivery, record, terminate=terminate)
    except MessageTooLarge as exc:
        record["payload"] = None
        record.pop("raw_b64", None)
        note = f" [its payload was dropped from this record: {exc}]"
        record["error"]["message"] = record["error"]["message"][:MAX_ERROR_CHARS] + note
        await receiver.dead_letter(delivery, record, terminate=terminate)
