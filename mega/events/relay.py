"""OutboxRelay: moves committed outbox rows to the bus, in order, and marks them published.

One batch, in one database transaction:
1. take up to `batch` pending rows in insertion order: `FOR UPDATE SKIP LOCKED` on PostgreSQL,
   so several relays split the rows; on SQLite a write lock first, so relays take turns;
2. publish them all (pipelined) with `Nats-Msg-Id` = the event id, and wait for every PubAck;
3. mark them published and commit.
A relay that dies after 2 and before 3 leaves the rows pending: the next relay publishes them
again and JetStream drops the duplicates within its window (2 minutes); a listener group's inbox
covers a later repeat. One that dies before 2 loses nothing. NATS down: the rows wait, and the
relay drains them when it is back.

The relay wakes at once after a commit in its own process that added rows (see outbox.py),
otherwise every `poll_s`. Published rows are deleted after `retention_s`, in batches, so the
table does not grow without bound (the common failure of outboxes in production), and the
relay's query only ever walks pending rows (a partial index).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import delete, select, update

from mega.events.bus import EventBus
from mega.events.outbox import OutboxRow, on_commit
from mega.jobs.consumer import NATS_ERRORS
from mega.signals import Observer, Signals

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from sqlalchemy.orm import Session

    from mega.context import Context

logger = logging.getLogger("mega.relay")

SIGNALS = ("published", "error")
# A commit that added rows in another process says so here (core NATS, fire and forget), so
# relays wake at once wherever the row was written; the poll is only the fallback.
WAKE_SUBJECT = "mega.outbox.wake"
DEFAULT_BATCH = 2000
DEFAULT_POLL_S = 0.5
# Published rows are kept this long (for the pages that show them), then deleted.
DEFAULT_RETENTION_S = 3600.0
# Published rows deleted per statement while pruning, and how often pruning runs.
PRUNE_BATCH = 1000
PRUNE_EVERY_S = 10.0
# How long a batch waits for its PubAcks before it gives up (the rows stay pending). On SQLite
# writers wait for the relay's transaction meanwhile, so this stays short.
PUBLISH_TIMEOUT_S = 2.0
# After a failed batch (NATS or the database away), wait this long before the next try.
ERROR_BACKOFF_S = 1.0


class _Row(NamedTuple):
    seq: int
    event_id: str
    bus: str
    subject: str
    body: bytes
    headers: dict[str, str]
    created_at: datetime


class OutboxRelay:
    """Publish the outbox's pending rows; `run()` until `stop()`.

    `paused(ctx)`, when given, is awaited before each batch: while it returns True the relay
    publishes nothing (the rows pile up). Signals: `published` (count, lag_ms), `error`.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        batch: int = DEFAULT_BATCH,
        poll_s: float = DEFAULT_POLL_S,
        retention_s: float = DEFAULT_RETENTION_S,
        paused: Callable[[Context], Awaitable[bool]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.batch = batch
        self.poll_s = poll_s
        self.retention_s = retention_s
        self.paused = paused
        self.signals = Signals(SIGNALS)
        self.lag_ms = 0.0  # age of the oldest row still pending after the last batch
        self.published = 0
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._done = asyncio.Event()
        # Every database call of this relay runs on this one thread, in order.
        self._db_thread = ThreadPoolExecutor(1, thread_name_prefix="mega-relay")
        self._last_warning = ""
        self._task: asyncio.Task[None] | None = None
        self._streams_ready: set[str] = set()
        self._js: dict[str, JetStreamContext] = {}

    def on(self, name: str, observer: Observer) -> None:
        self.signals.on(name, observer)

    async def start(self) -> None:
        """Run the relay in the background until `stop()`."""
        self._task = asyncio.create_task(self.run(), name="mega-outbox-relay")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def wake() -> None:  # called from the thread that committed
            loop.call_soon_threadsafe(self._wakeup.set)

        unregister = on_commit(wake)
        subscriptions = []
        for bus in self.ctx.buses.values():
            with contextlib.suppress(*NATS_ERRORS):
                subscriptions.append(await bus.native.subscribe(WAKE_SUBJECT, cb=self._on_wake))
        pruned_at = 0.0
        try:
            while not self._stopping:
                self._wakeup.clear()
                full = False
                try:
                    if self.paused is None or not await self.paused(self.ctx):
                        full = await self.relay_once() >= self.batch
                    if time.monotonic() - pruned_at >= PRUNE_EVERY_S:
                        pruned_at = time.monotonic()
                        await self.prune()
                    self._last_warning = ""
                except Exception as exc:  # NATS or the database away: wait, never die
                    error = _describe(exc)
                    self._warn(f"outbox relay: {error}; retrying")
                    await self.signals.emit("error", error=error)
                    await self._sleep(ERROR_BACKOFF_S)
                    continue
                if not full:
                    await self._sleep(self.poll_s)
        finally:
            unregister()
            for subscription in subscriptions:
                with contextlib.suppress(*NATS_ERRORS):
                    await subscription.unsubscribe()
            self._db_thread.shutdown(wait=False)
            self._done.set()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the batch in hand (bounded), then return."""
        self._stopping = True
        self._wakeup.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._done.wait()

    async def relay_once(self) -> int:
        """Publish one batch of pending rows; returns how many were published."""
        if not all(bus.native.is_connected for bus in self.ctx.buses.values()):
            raise ConnectionError("NATS is not connected; the outbox waits")
        session = self.ctx.db.sessions()
        try:
            rows = await self._in_db(_take_batch, session, self.batch)
            if not rows:
                await self._in_db(_end, session, commit=True)
                self.lag_ms = 0.0
                return 0
            await self._publish(rows)
            await self._in_db(_mark_published, session, [row.seq for row in rows])
        except BaseException:
            with contextlib.suppress(Exception):
                await self._in_db(_end, session, commit=False)
            raise
        now = datetime.now(UTC)
        self.lag_ms = max(0.0, (now - _aware(rows[0].created_at)).total_seconds() * 1000)
        self.published += len(rows)
        await self.signals.emit("published", count=len(rows), lag_ms=round(self.lag_ms, 1))
        return len(rows)

    async def prune(self) -> int:
        """Delete published rows older than `retention_s`, PRUNE_BATCH per statement."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.retention_s)
        total = 0
        while True:
            deleted: int = await self._in_db(_prune_some, self.ctx.db.sessions, cutoff)
            total += deleted
            if deleted < PRUNE_BATCH:
                return total

    async def _publish(self, rows: list[_Row]) -> None:
        for alias in {row.bus for row in rows} - self._streams_ready:
            # The events stream may not exist yet (no listener ever started): make it, or the
            # publishes would find no stream to answer them.
            await EventBus(self.ctx, alias).ensure_stream()
            self._streams_ready.add(alias)
        futures: list[asyncio.Future[Any]] = []
        try:
            for row in rows:
                js = self._js.get(row.bus)
                if js is None:  # one JetStreamContext per bus: each has its own PubAck inbox
                    js = self._js[row.bus] = self.ctx.bus(row.bus).js
                futures.append(await js.publish_async(row.subject, row.body, headers=row.headers))
            await asyncio.wait_for(asyncio.gather(*futures), PUBLISH_TIMEOUT_S)
        except (*NATS_ERRORS, TimeoutError):
            for future in futures:
                future.cancel()
            raise

    async def _on_wake(self, msg: Any) -> None:
        self._wakeup.set()

    async def _in_db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db_thread, lambda: fn(*args, **kwargs))

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wakeup.wait()

    def _warn(self, message: str) -> None:
        if message != self._last_warning:  # an outage repeats itself: say it once
            logger.warning("%s", message)
            self._last_warning = message


def announce_commits(ctx: Context) -> Callable[[], None]:
    """In a process without a relay (the web app): after each commit that added outbox rows,
    tell the relays elsewhere to look now. Returns a function that stops it."""
    loop = asyncio.get_running_loop()
    buses = list(ctx.buses.values())

    def announce() -> None:  # called from the thread that committed
        for bus in buses:
            loop.call_soon_threadsafe(_publish_quietly, bus.native)

    return on_commit(announce)


_announcing: set[asyncio.Task[None]] = set()  # keeps the fire-and-forget tasks alive


def _publish_quietly(nc: Any) -> None:
    async def publish() -> None:
        with contextlib.suppress(*NATS_ERRORS):
            await nc.publish(WAKE_SUBJECT, b"")

    task = asyncio.get_running_loop().create_task(publish())
    _announcing.add(task)
    task.add_done_callback(_announcing.discard)


# -- database steps (run on the relay's thread) ---------------------------------------------------


def _take_batch(session: Session, limit: int) -> list[_Row]:
    pending = select(OutboxRow.seq).where(OutboxRow.published_at.is_(None)).limit(1)
    if session.scalar(pending) is None:
        return []  # nothing to do: no lock taken, writers never wait for an idle relay
    if session.get_bind().dialect.name == "sqlite":
        # SQLite has no row locks: take the database's write lock now, so that relays in other
        # processes wait for this batch to be marked instead of publishing the same rows.
        session.execute(update(OutboxRow).where(OutboxRow.seq == -1).values(seq=OutboxRow.seq))
    columns = (
        OutboxRow.seq, OutboxRow.event_id, OutboxRow.bus, OutboxRow.subject, OutboxRow.body,
        OutboxRow.headers, OutboxRow.created_at,
    )  # fmt: skip
    rows = session.execute(
        select(*columns)
        .where(OutboxRow.published_at.is_(None))
        .order_by(OutboxRow.seq)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    return [
        _Row(seq, event_id, bus, subject, body.encode(), json.loads(headers), created_at)
        for seq, event_id, bus, subject, body, headers, created_at in rows
    ]


def _mark_published(session: Session, seqs: list[int]) -> None:
    session.execute(
        update(OutboxRow).where(OutboxRow.seq.in_(seqs)).values(published_at=datetime.now(UTC))
    )
    session.commit()
    session.close()


def _end(session: Session, *, commit: bool) -> None:
    if commit:
        session.commit()
    else:
        session.rollback()
    session.close()


def _prune_some(sessions: Callable[[], Session], cutoff: datetime) -> int:
    with sessions.begin() as session:  # type: ignore[attr-defined]
        oldest = (
            select(OutboxRow.seq)
            .where(OutboxRow.published_at.is_not(None), OutboxRow.published_at < cutoff)
            .order_by(OutboxRow.seq)
            .limit(PRUNE_BATCH)
        )
        result = session.execute(delete(OutboxRow).where(OutboxRow.seq.in_(oldest)))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]


def _describe(exc: Exception) -> str:
    """One line: SQLAlchemy's errors carry the statement and a link on the lines after."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "no such table" in text or "does not exist" in text:
        text += " (run `mega db upgrade`, or start the web app, which applies the migrations)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; every value stored is UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)
