"""OutboxRelay: moves committed outbox rows to the bus, in order, and marks them published.

One batch, in one database transaction:
1. take up to `batch` pending rows in insertion order: `FOR UPDATE SKIP LOCKED` on PostgreSQL,
   so several relays split the rows; on SQLite a write lock first, so relays take turns;
2. publish them all (pipelined) with `Nats-Msg-Id` = the event id, and wait for every PubAck;
   a job's row (`outbox.enqueue`) is enqueued on its job's bus, the job id its dedup id;
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
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from mega import tracing
from mega.drivers.base import Message
from mega.events.bus import EventBus
from mega.jobs.queue import queue_of
from mega.jobs.spec import JobBase, JobSpec, validate_job
from mega.signals import Observer, Signals
from mega.tasks import wait_event
from mega.transactional import outbox_rows
from mega.transactional.outbox_rows import Row, aware
from mega.transactional.store import job_of_row, on_commit, row_job, row_message

if TYPE_CHECKING:
    from mega.context import Context

logger = logging.getLogger("mega.relay")

SIGNALS = ("published", "error")
DEFAULT_BATCH = 2000
DEFAULT_POLL_S = 0.5
# Published rows are kept this long (for the pages that show them), then deleted.
DEFAULT_RETENTION_S = 3600.0
# How often pruning runs.
PRUNE_EVERY_S = 10.0
# After a failed batch (NATS or the database away), wait this long before the next try.
ERROR_BACKOFF_S = 1.0


class OutboxRelay:
    """Publish the outbox's pending rows; `run()` until `stop()`.

    Signals: `published` (count, lag_ms), `error`.
    """

    def __init__(
        self,
        ctx: Context,
        *,
        batch: int = DEFAULT_BATCH,
        poll_s: float = DEFAULT_POLL_S,
        retention_s: float = DEFAULT_RETENTION_S,
        paused: Callable[[Context], Awaitable[bool]] | None = None,
        jobs: Iterable[type[JobBase]] = (),
    ) -> None:
        """A relay over the context's database and buses; it runs once `run()` or `start()` is
        called.

        Args:
            ctx: the host's context: the database that holds the outbox (`ctx.db`), and the
                buses the rows go to.
            batch: the most pending rows taken, published and marked in one transaction
                (default 2000). A full batch is followed by the next at once.
            poll_s: how long to wait after a batch that was not full, in seconds, unless a
                commit wakes the relay first (default 0.5).
            retention_s: how long published rows are kept before they are deleted, in seconds
                (default an hour).
            paused: when given, `paused(ctx)` is awaited before each batch: while it returns
                True the relay publishes nothing (the rows pile up). None (the default): never
                paused.
            jobs: the Job classes whose rows it enqueues (a worker's `config.jobs`), each
                validated here; a row of any other job stays pending, for a relay that has it.
        """
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
        # One EventBus per bus alias, kept: each holds its JetStreamContext (its PubAck inbox).
        self._buses: dict[str, EventBus] = {}
        # The jobs whose rows it enqueues (`outbox.enqueue`), by name.
        self._jobs: dict[str, tuple[type[JobBase], JobSpec]] = {}
        for job_cls in jobs:
            spec = validate_job(job_cls, ctx.buses)
            self._jobs[spec.name] = (job_cls, spec)
        self._unknown: set[str] = set()  # the job names of rows it left, already warned of
        # Rows over what their bus's engine takes: left pending (never lost), said once, and
        # passed over so that the rows after them go on.
        self._refused: set[int] = set()

    def on(self, name: str, observer: Observer) -> None:
        """Observe a signal; an unknown name raises ValueError.

        Args:
            name: `published` (with `count` and `lag_ms`) or `error` (with `error`).
            observer: called with each such signal, a dict `{"signal": name, **fields}`.
        """
        self.signals.on(name, observer)

    async def start(self) -> None:
        """Run the relay in the background until `stop()`."""
        self._task = asyncio.create_task(self.run(), name="mega-outbox-relay")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def wake() -> None:  # called from the thread that committed
            loop.call_soon_threadsafe(self._wakeup.set)

        unregister = on_commit(wake)
        unwatch = [await self.bus(name).watch_commits(self._wakeup.set) for name in self.ctx.buses]
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
            for stop_watching in unwatch:
                await stop_watching()
            self._db_thread.shutdown(wait=False)
            self._done.set()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the batch in hand, then return.

        Args:
            timeout_s: how long to wait for it, in seconds (default 10); past it, this returns
                and the relay ends on its own once that batch is done.
        """
        self._stopping = True
        self._wakeup.set()
        await wait_event(self._done, timeout_s)

    async def relay_once(self) -> int:
        """Publish one batch of pending rows; returns how many were published (a job row whose
        job this relay's config does not declare stays pending, for a relay that does)."""
        for alias in self.ctx.buses:
            if not self.bus(alias).connected:
                raise ConnectionError(f"bus {alias!r} is not connected; the outbox waits")
        session = self.ctx.db.sessions()
        try:
            rows = await self._in_db(outbox_rows.take_batch, session, self.batch, self._refused)
            if not rows:
                await self._in_db(outbox_rows.end, session, commit=True)
                self.lag_ms = 0.0
                return 0
            rows = await self._publish(rows)
            await self._in_db(outbox_rows.mark_published, session, [row.seq for row in rows])
        except BaseException:
            with contextlib.suppress(Exception):
                await self._in_db(outbox_rows.end, session, commit=False)
            raise
        if not rows:
            return 0
        now = datetime.now(UTC)
        self.lag_ms = max(0.0, (now - aware(rows[0].created_at)).total_seconds() * 1000)
        self.published += len(rows)
        await self.signals.emit("published", count=len(rows), lag_ms=round(self.lag_ms, 1))
        return len(rows)

    async def prune(self) -> int:
        """Delete published rows older than `retention_s`, PRUNE_BATCH per statement."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.retention_s)
        total = 0
        while True:
            deleted: int = await self._in_db(outbox_rows.prune_some, self.ctx.db.sessions, cutoff)
            total += deleted
            if deleted < outbox_rows.PRUNE_BATCH:
                return total

    def bus(self, alias: str) -> EventBus:
        """The EventBus the relay publishes a bus's events on, made on first use and kept.

        Args:
            alias: a bus alias of the config (ConfigError naming it otherwise).
        """
        bus = self._buses.get(alias)
        if bus is None:
            bus = self._buses[alias] = EventBus(self.ctx, alias)
        return bus

    async def _publish(self, rows: list[Row]) -> list[Row]:
        """Publish the rows' events and enqueue their jobs; the rows done (all but the jobs
        this relay does not know)."""
        by_bus: dict[str, list[Message]] = {}
        by_job: dict[str, list[Message]] = {}
        done = []
        for row in rows:
            if self._too_large(row):
                continue
            name = job_of_row(row.subject)
            if name is None:
                message = row_message(row.event_id, row.subject, row.body, row.headers)
                by_bus.setdefault(row.bus, []).append(message)
            elif (known := self._job(name)) is not None:
                message = row_job(known[1].subject, row.body, row.headers)
                by_job.setdefault(name, []).append(message)
            else:
                continue
            done.append(row)
        await self._publish_events(by_bus)
        for name, messages in by_job.items():
            await self._enqueue(*self._jobs[name], messages)
        return done

    def _too_large(self, row: Row) -> bool:
        """Whether the row's body is over what its bus's engine takes (a NATS server's
        max_payload, less its headers; `outbox.add` checked the class's own cap): such a row
        would be refused at each try and hold up every row after it. It stays pending, and
        is said once."""
        limit = getattr(self.ctx.buses.get(row.bus), "max_body_bytes", None)
        if limit is None or len(row.body) <= limit:
            return False
        self._refused.add(row.seq)
        logger.error(
            "outbox relay: row %d (%s) is %d bytes, over what bus %r takes (%d): it stays "
            "pending, passed over, while the rows after it go on; raise the server's "
            "max_payload, or delete the row (mega_outbox.seq = %d) and lower the class's "
            "max_payload_bytes",
            row.seq,
            row.subject,
            len(row.body),
            row.bus,
            limit,
            row.seq,
        )
        return True

    def _job(self, name: str) -> tuple[type[JobBase], JobSpec] | None:
        known = self._jobs.get(name)
        if known is None and name not in self._unknown:  # said once per job name
            self._unknown.add(name)
            logger.warning(
                "outbox relay: a row enqueues job %r, which this worker's config does not "
                "declare; it waits for a worker that does (add it to jobs = [...])",
                name,
            )
        return known

    async def _enqueue(
        self, job_cls: type[JobBase], spec: JobSpec, messages: list[Message]
    ) -> None:
        queue = queue_of(self.ctx, spec.bus)
        store = functools.partial(queue._enqueue_encoded, job_cls)
        await _traced("send", queue.bus.driver, messages, store)

    async def _publish_events(self, by_bus: dict[str, list[Message]]) -> None:
        for alias, messages in by_bus.items():
            bus = self.bus(alias)
            await _traced("publish", bus.bus.driver, messages, bus.publish_many)

    async def _in_db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db_thread, lambda: fn(*args, **kwargs))

    async def _sleep(self, seconds: float) -> None:
        await wait_event(self._wakeup, seconds)

    def _warn(self, message: str) -> None:
        if message != self._last_warning:  # an outage repeats itself: say it once
            logger.warning("%s", message)
            self._last_warning = message


async def _traced(
    operation: str,
    system: str,
    messages: list[Message],
    store: Callable[[list[Message]], Awaitable[Any]],
) -> None:
    """Store `messages`, each in a producer span `<operation> <subject>` that continues the
    context its row holds (`store` alone without an SDK)."""
    if tracing.tracer() is None:
        await store(messages)
        return
    each = [(message.subject, message.id, message.trace) for message in messages]
    with tracing.producing_each(operation, each, system=system) as traces:
        await store(
            [replace(message, trace=trace) for message, trace in zip(messages, traces, strict=True)]
        )


def announce_commits(ctx: Context) -> Callable[[], None]:
    """In a process without a relay (the web app): after each commit that added outbox rows,
    tell the relays elsewhere to look now. Returns a function that stops it."""
    loop = asyncio.get_running_loop()
    buses = [EventBus(ctx, alias) for alias in ctx.buses]

    def announce() -> None:  # called from the thread that committed
        for bus in buses:
            loop.call_soon_threadsafe(bus.announce_commit)

    return on_commit(announce)


def _describe(exc: Exception) -> str:
    """One line: SQLAlchemy's errors carry the statement and a link on the lines after."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "no such table" in text or "does not exist" in text:
        text += " (run `mega db upgrade`, or start the web app, which applies the migrations)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
