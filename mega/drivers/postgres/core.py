"""What every part of the Postgres bus shares: its connection and state (`PostgresCore`) and
the helpers of its parts. The parts: bus.py (the lanes), dead.py, records.py, events.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Self

import psycopg

from mega.constants import CLOSE_TASKS_S
from mega.drivers.base import (
    DlqRecord,
    DriverUnavailable,
    Lane,
    Message,
)
from mega.drivers.postgres import schema, sql
from mega.drivers.postgres.common import Connection, lane_key, one_line, open_connection, redact
from mega.drivers.postgres.receiver import PostgresReceiver
from mega.errors import DependencyUnavailable
from mega.settings import BusSpec
from mega.tasks import cancel_and_wait

if TYPE_CHECKING:
    pass

logger = logging.getLogger("mega.drivers.postgres")

# How long the LISTEN connection waits before connecting again after losing the server.
LISTEN_RETRY_S = 1.0
# pg_advisory_xact_lock key of `ensure`: processes starting together create the tables once
# (racing CREATE TABLE IF NOT EXISTS can still fail on the catalog's unique index). "mgdl".
DDL_LOCK_KEY = 0x6D67646C


def job_body(record: DlqRecord) -> bytes:
    """The body of a dead letter's job: its raw bytes when it was not JSON, else its payload."""
    raw = record.get("raw_b64")
    if raw:
        return base64.b64decode(raw)
    return json.dumps(record["payload"], separators=(",", ":")).encode()


def stored_key(lane: Lane, flow_key: str | None) -> str | None:
    """The key a job's row carries: on a fair lane, FAIR_NO_KEY for a job without one, so that
    it takes its turns in the key index like any key (`_delivery` hands it back as None)."""
    return flow_key or schema.FAIR_NO_KEY if lane.fair else flow_key


def publish_params(lane: Lane, message: Message) -> dict[str, Any]:
    """A job's row; its `priority` only on a prioritized lane (NULL elsewhere: the rows a
    prioritized claim reads are then the only ones in its index, schema.BAND_INDEX_DDL)."""
    return {
        "lane": lane_key(lane),
        "job_id": message.id,
        "subject": message.subject,
        "body": message.body,
        "enqueued_at_ms": message.enqueued_at_ms,
        "run_at_ms": message.run_at_ms,
        "dedup": message.dedup,
        "trace": sql.trace_text(message.trace),
        "flow_key": stored_key(lane, message.flow_key),
        "priority": message.priority if lane.prioritized else None,
    }


class PostgresCore:
    """A bus's connections to PostgreSQL: the publishing one, and the one that LISTENs for
    the wake-ups (see bus.py's docstring for the tables)."""

    driver: ClassVar[str] = "postgres"
    fair_lanes: ClassVar[bool] = True
    priority_lanes: ClassVar[bool] = True

    def __init__(self, alias: str, spec: BusSpec, connection: Connection, listen: Connection):
        self.alias = alias
        self.spec = spec
        self.url = str(spec.url)
        self._connection = connection
        # Every use of the publishing connection holds this: a transaction block must not
        # take in another coroutine's statement.
        self._lock = asyncio.Lock()
        self._schema_ready = False
        # Kept from ensure_events/emit: receivers prune the events log by it (0: forever).
        self.events_max_age_s = 0.0
        # NOTIFY payload -> the events of the receivers waiting on it.
        self._wakers: dict[str, set[asyncio.Event]] = {}
        self._commit_watchers: set[Callable[[], None]] = set()
        self._receivers: set[PostgresReceiver] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._listener = asyncio.create_task(self._listen_forever(listen), name="mega-pg-listen")

    # -- connection ---------------------------------------------------------------------------

    @property
    def native(self) -> Connection:
        return self._connection

    @property
    def connected(self) -> bool:
        return not (self._closed or self._connection.closed or self._connection.broken)

    @classmethod
    async def connect(cls, alias: str, spec: BusSpec) -> Self:
        url = str(spec.url)
        opened: list[Connection] = []
        try:
            for _ in range(2):  # publishing, LISTEN
                opened.append(await open_connection(url))
        except (psycopg.Error, OSError, TimeoutError) as exc:
            for connection in opened:
                await connection.close()
            message = f"cannot reach PostgreSQL {alias!r} at {redact(url)} ({one_line(exc)})"
            raise DependencyUnavailable("postgres", message) from exc
        return cls(alias, spec, opened[0], opened[1])

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait([self._listener], CLOSE_TASKS_S)
        if self._tasks:  # the last announcements leave
            await asyncio.wait(self._tasks, timeout=CLOSE_TASKS_S)
        for receiver in list(self._receivers):
            with contextlib.suppress(Exception):
                await receiver.close()
        with contextlib.suppress(Exception):
            await self._connection.close()

    async def ping(self) -> None:
        async with self._using("ping") as connection:
            await connection.execute("SELECT 1")

    @asynccontextmanager
    async def _using(self, what: str) -> AsyncIterator[Connection]:
        """The publishing connection, alone, reconnected when lost; its errors become
        DriverUnavailable naming `what`."""
        async with self._lock:
            try:
                if self._connection.closed or self._connection.broken:
                    self._connection = await open_connection(self.url)
                yield self._connection
            except (psycopg.Error, OSError, TimeoutError) as exc:
                raise DriverUnavailable(f"{what}: {one_line(exc)}") from exc

    async def ensure_schema(self, connection: Connection) -> None:
        """The tables, where missing (once per bus)."""
        if self._schema_ready:
            return
        cursor = await connection.execute(schema.SCHEMA_READY)
        if (await cursor.fetchone()) == (True,):
            self._schema_ready = True
            return
        async with connection.transaction():
            await connection.execute(f"SELECT pg_advisory_xact_lock({DDL_LOCK_KEY})")
            for statement in schema.SCHEMA:
                await connection.execute(statement)  # type: ignore[arg-type]  # constants
        self._schema_ready = True

    # -- wake-ups -----------------------------------------------------------------------------

    def subscribe(self, payloads: Sequence[str], event: asyncio.Event) -> None:
        """Set `event` at each NOTIFY on the lanes' channel with one of `payloads`."""
        for payload in payloads:
            self._wakers.setdefault(payload, set()).add(event)

    def unsubscribe(self, payloads: Sequence[str], event: asyncio.Event) -> None:
        for payload in payloads:
            self._wakers.get(payload, set()).discard(event)

    def forget(self, receiver: PostgresReceiver) -> None:
        self._receivers.discard(receiver)

    async def _listen_forever(self, connection: Connection | None) -> None:
        """Hear the NOTIFYs of the lanes and of the outbox; reconnect when the server goes (the
        receivers poll meanwhile, and are all woken once back, for what they missed)."""
        warned = ""
        while True:
            try:
                if connection is None:
                    connection = await open_connection(self.url)
                await connection.execute(f"LISTEN {schema.WAKE_CHANNEL}")
                await connection.execute(f"LISTEN {schema.OUTBOX_CHANNEL}")
                if warned:
                    logger.info("%s: listening again", self.alias)
                    warned = ""
                    self._wake_everyone()
                async for note in connection.notifies():
                    if note.channel == schema.OUTBOX_CHANNEL:
                        for wake in list(self._commit_watchers):
                            wake()
                    else:
                        for event in self._wakers.get(note.payload, ()):
                            event.set()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if one_line(exc) != warned:
                    warned = one_line(exc)
                    logger.warning("%s: LISTEN lost (%s); polling meanwhile", self.alias, warned)
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()
                connection = None
                await asyncio.sleep(LISTEN_RETRY_S)
            finally:
                if self._closed and connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()

    def _wake_everyone(self) -> None:
        for events in self._wakers.values():
            for event in events:
                event.set()
        for wake in list(self._commit_watchers):
            wake()


async def each_row(
    cursor: psycopg.AsyncCursor[tuple[Any, ...]], statement: str, params: list[dict[str, Any]]
) -> list[bool]:
    """Run `statement` once per params (pipelined: one round trip), each answering one row or
    none; True each time a row came back and it was not false."""
    await cursor.executemany(statement, params, returning=True)  # type: ignore[arg-type]
    found: list[bool] = []
    while True:
        row = await cursor.fetchone()
        found.append(row is not None and row[0] is not False)
        if not cursor.nextset():
            return found


async def one(cursor: psycopg.AsyncCursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    row = await cursor.fetchone()
    assert row is not None  # an aggregate always answers one row
    return row
