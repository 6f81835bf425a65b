"""What a driver gives the consume loop for one lane: a `Receiver` (the interface of
mega/drivers/base.py, where the rest of it is, and whence it is imported)."""

from __future__ import annotations

from typing import Protocol

from mega.drivers.values import Delivery, DlqRecord


class Receiver(Protocol):
    """One lane consumed in this process: what the consume loop calls, and nothing more.

    Settling calls (`ack`, `retry`, `extend`, `release`) never raise: when the engine is away
    the delivery simply comes back later (at-least-once). `dead_letter` raises
    DriverUnavailable when the record could not be stored, and then leaves the delivery
    unsettled for the loop to `release`."""

    async def fetch(self, limit: int) -> list[Delivery]:
        """Up to `limit` deliveries, as soon as at least one is there; [] after a short wait
        (at most about half a second) with none, or once `wake()` was called. Waits out an
        outage (returns []), never raises for it.

        Args:
            limit: the most deliveries to return: the consume loop's free slots, never more
                than the lane's `concurrency` (fewer while a rate limit holds it back). Each
                one returned is this process's until it is settled.
        """
        ...

    def wake(self) -> None:
        """Make a waiting `fetch` return now (the loop is stopping)."""
        ...

    async def ack(self, delivery: Delivery) -> None:
        """Done: it never comes back.

        Args:
            delivery: one that this receiver's `fetch` returned and that is not settled yet.
        """
        ...

    async def retry(self, delivery: Delivery, *, due_ms: int, attempts: int) -> None:
        """Run it again at `due_ms` (epoch ms), its next delivery being attempt `attempts + 1`,
        without holding a slot of the lane's concurrency while it waits; the next delivery
        carries `delivery.trace` as it is now.

        Args:
            delivery: one that this receiver's `fetch` returned and that is not settled yet;
                its id, body, `flow_key` and `trace` go with the next attempt.
            due_ms: when the next attempt is due, in epoch milliseconds; a time already past
                means now.
            attempts: the attempts counted so far: `delivery.attempt` after a failed run, or
                `delivery.attempt - 1` for a delivery the lane's limits held back before it
                ran (its attempt unchanged).
        """
        ...

    async def extend(self, delivery: Delivery) -> None:
        """Still running: push its ack wait back by a full `ack_wait_s`.

        Args:
            delivery: one that this receiver's `fetch` returned and that still runs (not
                settled yet); the consume loop extends each one every third of `ack_wait_s`.
        """
        ...

    async def release(self, delivery: Delivery, *, delay_s: float) -> None:
        """Hand it back unsettled, to be delivered again (to any worker) after `delay_s`.

        Args:
            delivery: one that this receiver's `fetch` returned and that is not settled yet;
                its next delivery counts as the next attempt.
            delay_s: seconds before it may be delivered again (0: at once). On Redis the wait
                is at most the lane's `ack_wait_s`.
        """
        ...

    async def dead_letter(self, delivery: Delivery, record: DlqRecord, *, terminate: bool) -> None:
        """Store `record` in the lane's dead letters and settle the delivery (`terminate`: a
        message no one can decode). Raises DriverUnavailable when the record was not stored.

        Args:
            delivery: one that this receiver's `fetch` returned and that is not settled yet;
                it is not delivered again once the record is stored.
            record: the dead letter to store, as mega/lanes/dlq_writer.py builds it; the store
                numbers its records itself (their `seq`), whatever `seq` it carries.
            terminate: True for a message that nothing would ever run (its body is not JSON,
                or its id or key is invalid): NATS terminates it instead of acking it; the
                other engines end it the same way either way.
        """
        ...

    async def close(self) -> None:
        """Send what is still buffered (acks) and let go of the lane's resources."""
        ...
