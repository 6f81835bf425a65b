"""One lane consumed in this process, on a connection of its own: claims, settles, pruning.

A group's receiver first copies the new matching events past the group's cursor into its lane
(see sql.COPY_EVENTS), then claims like a job's. Settles never raise: a delivery whose ack,
retry or extend was lost comes back when its lease runs out (at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from mega.drivers.base import (
    PRIORITIES,
    PRIORITY_TURNS,
    Delivery,
    DlqRecord,
    DriverUnavailable,
    Lane,
    trace_headers,
)
from mega.drivers.postgres import schema, sql
from mega.drivers.postgres.common import Connection, lane_key, one_line, open_connection
from mega.tasks import wait_event

logger = logging.getLogger("mega.drivers.postgres")

# The fallback when no NOTIFY comes: a fetch waits at most this long (the contract's "about
# half a second"), less when the lane's next delayed row is due sooner.
POLL_S = 0.5
# How often a receiver deletes expired dedup keys and records, old dead letters and old events.
# Each is one indexed DELETE; once a minute per receiver keeps the tables small at no visible
# cost.
PRUNE_EVERY_S = 60.0
# Events copied into a group's lane per fetch at most (the rest at the next fetch).
COPY_BATCH = 1000
# The errors that mean "the server is away": waited out, never raised from fetch or settles.
Unavailable = (psycopg.Error, OSError, TimeoutError)


class Host(Protocol):
    """What a receiver needs of its bus (PostgresBus): where to connect, its wake-ups."""

    url: str
    events_max_age_s: float

    def subscribe(self, payloads: Sequence[str], event: asyncio.Event) -> None: ...
    def unsubscribe(self, payloads: Sequence[str], event: asyncio.Event) -> None: ...
    def forget(self, receiver: PostgresReceiver) -> None: ...


class PostgresReceiver:
    def __init__(self, bus: Host, lane: Lane, consumer: str) -> None:
        self._bus = bus
        self._lane = lane
        self._key = lane_key(lane)
        self._consumer = consumer
        self._pattern = sql.pattern_regex(lane.subject) if lane.kind == "group" else ""
        self._connection: Connection | None = None
        # One statement or transaction at a time on the connection: a settle must not slip
        # into a group's copy transaction (and be rolled back with it).
        self._lock = asyncio.Lock()
        # Set by a NOTIFY for the lane (or for an emit, on a group), and by wake().
        self._signal = asyncio.Event()
        self._woken = False
        self._acks: list[int] = []
        self._flusher: asyncio.Task[None] | None = None
        self._pruned_at = 0.0
        self._warned = ""
        self._turn = 0  # a prioritized lane's turns taken (sql.CLAIM_PRIORITY)
        self._after = schema.FAIR_NO_KEY  # a fair lane's key of the last turn taken (CLAIM_FAIR)
        self._payloads = [self._key] + ([schema.EVENTS_PAYLOAD] if lane.kind == "group" else [])
        bus.subscribe(self._payloads, self._signal)

    # -- fetch --------------------------------------------------------------------------------

    async def fetch(self, limit: int) -> list[Delivery]:
        if self._woken:
            self._woken = False
            return []
        self._signal.clear()  # a NOTIFY from now on ends the wait below
        claimed = await self._claim(limit)
        if claimed is None:  # the server is away: wait, and say nothing
            await self._wait(POLL_S)
            self._woken = False
            return []
        deliveries, next_due_s = claimed
        if deliveries:
            return deliveries
        wait = POLL_S if next_due_s is None else max(0.0, min(POLL_S, next_due_s))
        await self._wait(wait)
        if self._woken:
            self._woken = False
            return []
        claimed = await self._claim(limit)
        return [] if claimed is None else claimed[0]

    def wake(self) -> None:
        self._woken = True
        self._signal.set()

    async def _wait(self, timeout_s: float) -> None:
        await wait_event(self._signal, timeout_s)

    async def _claim(self, limit: int) -> tuple[list[Delivery], float | None] | None:
        """The deliveries claimed, and when none, the seconds until the next delayed row is
        due (None: no such row); None when the server is away."""
        async with self._lock:
            try:
                connection = await self._connect()
                if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
                    self._pruned_at = time.monotonic()
                    await self._prune(connection)
                if self._lane.kind == "group":
                    await self._copy_events(connection)
                params = {
                    "lane": self._key,
                    "limit": limit,
                    "ack_wait_s": float(self._lane.ack_wait_s),
                    "consumer": self._consumer,
                }
                statement = sql.CLAIM
                if self._lane.fair:
                    statement, params["after"] = sql.CLAIM_FAIR, self._after
                if self._lane.prioritized:
                    statement, params["quotas"] = sql.CLAIM_PRIORITY, self._quotas(limit)
                cursor = await connection.execute(statement, params)
                rows = await cursor.fetchall()
                self._turn += len(rows)
                if self._lane.fair and rows:
                    self._after = max((row[9] for row in rows), key=self._round_from_after)
                next_due_s: float | None = None
                if not rows:
                    cursor = await connection.execute(sql.NEXT_DUE, {"lane": self._key})
                    row = await cursor.fetchone()
                    next_due_s = None if row is None or row[0] is None else float(row[0])
            except Unavailable as exc:
                await self._lost(exc)
                return None
        self._warned = ""
        rows.sort(key=lambda row: (row[7], row[0]))  # RETURNING keeps no order: run_at, id
        return [_delivery(row) for row in rows], next_due_s

    def _round_from_after(self, key: str) -> tuple[bool, str]:
        """Where a fair lane's key stands in the walk of the next claim: the keys after the
        last turn's, then round from the least (sql.CLAIM_FAIR). The last of a claim's keys in
        that order is the next claim's `after`."""
        return key <= self._after, key

    def _quotas(self, limit: int) -> list[int]:
        """How many of the next `limit` turns each band has (PRIORITIES order), from the turn
        after this receiver's last claim."""
        turns = [PRIORITY_TURNS[(self._turn + n) % len(PRIORITY_TURNS)] for n in range(limit)]
        return [turns.count(band) for band in PRIORITIES]

    async def _copy_events(self, connection: Connection) -> None:
        """Move the events past the group's cursor into its lane (the matching ones), in one
        transaction holding the cursor row, so two processes never copy one event twice."""
        async with connection.transaction():
            cursor = await connection.execute(sql.CURSOR_LOCK, {"lane": self._key})
            row = await cursor.fetchone()
            if row is None:  # a peer of the group is copying right now (or no ensure() yet)
                return
            cursor = await connection.execute(
                sql.COPY_EVENTS,
                {
                    "lane": self._key,
                    "last_seq": row[0],
                    "limit": COPY_BATCH,
                    "pattern": self._pattern,
                },
            )
            copied = await cursor.fetchone()
            if copied is not None and copied[0]:
                # The group's other receivers (other processes) may take some of them.
                await connection.execute(
                    sql.NOTIFY, {"channel": schema.WAKE_CHANNEL, "payload": self._key}
                )

    async def _prune(self, connection: Connection) -> None:
        await connection.execute(sql.PRUNE_DEDUP)
        await connection.execute(sql.PRUNE_RECORDS)
        if self._lane.dlq_max_age_s > 0:
            await connection.execute(
                sql.PRUNE_DEAD, {"lane": self._key, "age_s": float(self._lane.dlq_max_age_s)}
            )
        if self._lane.kind == "group" and self._bus.events_max_age_s > 0:
            await connection.execute(sql.PRUNE_EVENTS, {"age_s": float(self._bus.events_max_age_s)})

    # -- settles ------------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        """Acks leave together, in the background: the first one starts a flush that deletes
        every row waiting (one statement), and those that come meanwhile join the next. An ack
        lost with its process only runs the job again (at-least-once)."""
        row_id, _ = delivery.handle
        self._acks.append(row_id)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_acks())

    async def _flush_acks(self) -> None:
        while self._acks:
            async with self._lock:
                ids, self._acks = self._acks, []
                try:
                    connection = await self._connect()
                    await connection.execute(sql.ACK, {"ids": ids})
                except Unavailable as exc:  # they come back after their lease: run again
                    await self._lost(exc)
                    return

    async def retry(self, delivery: Delivery, *, due_ms: int, attempts: int) -> None:
        await self._settle(
            sql.RETRY,
            delivery,
            due_ms=due_ms,
            attempts=attempts,
            trace=sql.trace_text(delivery.trace),
        )

    async def extend(self, delivery: Delivery) -> None:
        await self._settle(sql.EXTEND, delivery, ack_wait_s=float(self._lane.ack_wait_s))

    async def release(self, delivery: Delivery, *, delay_s: float) -> None:
        await self._settle(sql.RELEASE, delivery, delay_s=float(delay_s))

    async def _settle(self, statement: str, delivery: Delivery, **params: Any) -> None:
        row_id, deliveries = delivery.handle
        async with self._lock:
            try:
                connection = await self._connect()
                await connection.execute(
                    statement,  # type: ignore[arg-type]  # one of sql's constants
                    {"id": row_id, "deliveries": deliveries, **params},
                )
            except Unavailable as exc:
                await self._lost(exc)

    async def dead_letter(self, delivery: Delivery, record: DlqRecord, *, terminate: bool) -> None:
        """One statement stores the record and deletes the row (`terminate` needs nothing
        more: the row is gone either way)."""
        row_id, _ = delivery.handle
        async with self._lock:
            try:
                connection = await self._connect()
                await connection.execute(
                    sql.DEAD_LETTER,
                    {"id": row_id, "lane": self._key, "record": Jsonb(dict(record))},
                )
            except Unavailable as exc:
                await self._lost(exc)
                raise DriverUnavailable(f"{self._key}: dead letter not stored: {exc}") from exc

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._flusher is not None:
                await self._flusher
            await self._flush_acks()
        self._bus.unsubscribe(self._payloads, self._signal)
        self._bus.forget(self)
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None

    # -- the connection -----------------------------------------------------------------------

    async def _connect(self) -> Connection:
        if self._connection is None or self._connection.closed or self._connection.broken:
            self._connection = await open_connection(self._bus.url)
            if self._warned:
                logger.info("%s: PostgreSQL reachable again", self._key)
        return self._connection

    async def _lost(self, exc: BaseException) -> None:
        """Drop the connection (the next call opens another); say so once per new reason."""
        if one_line(exc) != self._warned:
            self._warned = one_line(exc)
            logger.warning("%s: PostgreSQL unavailable (%s); retrying", self._key, self._warned)
        if self._connection is not None and isinstance(exc, psycopg.OperationalError | OSError):
            with contextlib.suppress(Exception):
                await self._connection.close()
            self._connection = None


def _delivery(row: tuple[Any, ...]) -> Delivery:
    (
        row_id,
        job_id,
        subject,
        body,
        attempts,
        deliveries,
        enqueued_at_ms,
        run_at_ms,
        trace,
        flow_key,
    ) = row
    return Delivery(
        id=job_id,
        subject=subject,
        body=bytes(body),
        attempt=attempts + deliveries,
        enqueued_at_ms=enqueued_at_ms,
        run_at_ms=run_at_ms,
        key=row_id,
        # The row, and its claim: settles that change the row apply only while this claim is
        # its latest (see sql.EXTEND).
        handle=(row_id, deliveries),
        trace=trace_headers(trace),
        flow_key=flow_key or None,  # a fair lane's FAIR_NO_KEY is no key
    )
