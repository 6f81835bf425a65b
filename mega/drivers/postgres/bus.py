"""The `postgres` bus driver: jobs and events as rows, for a team whose only server is PostgreSQL.

Tables (sql.py holds their DDL and every statement):
    mega_bus_jobs     one row per job waiting or running, and per event copied to a group; a
                      worker claims due rows with FOR UPDATE SKIP LOCKED and leases them for the
                      lane's ack wait; a row whose lease ran out (its worker died) is claimed
                      again by anyone; an ack deletes the row
    mega_bus_dead     the dead letters (the DLQ record as jsonb), per lane
    mega_bus_dedup    caller-given ids seen within the 120 s window, per lane
    mega_bus_events   the events log, append-only, kept `max_age_s`, one row per event id
    mega_bus_cursors  per listener group, the last event seq it copied into its lane
    mega_bus_records  the lanes' records (status, result), one row per job id, live until its
                      `expires_at`; expired rows are deleted by the receivers now and then

A listener group is a lane like a job's: its receivers first copy the new matching events past
the group's cursor into the jobs table under the group's lane (cursor row locked, so one
process copies each event once), then claim them like jobs: retries, leases and dead letters
are the same code.

Connections: one for publishing and the bus's other calls (`native`), one per receiver for its
claims and settles, one that LISTENs. A publish or an emit sends `pg_notify` in its own
transaction, so waiting receivers wake at its commit; they poll every POLL_S otherwise.

The tables come with the framework's migrations (`mega db upgrade`, revisions 0003 and 0006);
`ensure` and `ensure_events` create them too when missing (same DDL), so a bus on a database
nobody migrated still works.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mega.drivers.base import (
    Lane,
    LaneStats,
    Message,
    Receiver,
)
from mega.drivers.postgres import schema, sql
from mega.drivers.postgres.common import lane_key
from mega.drivers.postgres.dead import PostgresDeadLetters
from mega.drivers.postgres.events import PostgresEventLog
from mega.drivers.postgres.receiver import PostgresReceiver
from mega.drivers.postgres.records import PostgresRecordStore
from mega.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

from mega.drivers.postgres.core import DDL_LOCK_KEY, each_row, one, publish_params


class PostgresBus(PostgresDeadLetters, PostgresRecordStore, PostgresEventLog):
    """The bus on PostgreSQL (see the module's docstring): the lanes here; the connections in
    core.py, and the other concerns in dead.py, records.py and events.py."""

    # -- lanes --------------------------------------------------------------------------------

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """The tables (if nobody migrated the database) and, for a group, its cursor at the
        oldest event kept. A lane has no limits stored in the database (its dead letters' age
        is read from the Lane when pruning), so `apply_limits` changes nothing."""
        async with self._using(f"cannot set up {lane_key(lane)}") as connection:
            await self.ensure_schema(connection)
            async with connection.transaction():  # racing creates of one sequence can fail
                await connection.execute(f"SELECT pg_advisory_xact_lock({DDL_LOCK_KEY})")
                counter = sql.COUNTER_CREATE.format(name=sql.counter_of(lane_key(lane)))
                await connection.execute(counter)  # type: ignore[arg-type]  # a hex name
            if lane.kind == "group":
                await connection.execute(sql.CURSOR_CREATE, {"lane": lane_key(lane)})

    async def publish(self, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        if not messages:
            return []
        key = lane_key(lane)
        async with (
            self._using(f"cannot publish to {key}") as connection,
            connection.transaction(),
            connection.cursor() as cursor,
        ):
            params = [publish_params(lane, message) for message in messages]
            kept = await each_row(cursor, sql.PUBLISH, params)
            if any(kept):
                await cursor.execute(sql.NOTIFY, {"channel": schema.WAKE_CHANNEL, "payload": key})
        return kept

    def publish_in(self, session: Session, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        """Store jobs through the caller's SQLAlchemy session (on this bus's database), in its
        transaction: they exist if and only if it commits, and its commit wakes the workers
        (the NOTIFY is part of it). True each one kept, False a duplicate id."""
        from sqlalchemy import text

        if session.get_bind().dialect.name != "postgresql":
            raise ConfigError("publish_in needs a session on the bus's PostgreSQL database")
        key = lane_key(lane)
        statement = text(sql.sqlalchemy_text(sql.PUBLISH))
        kept = [
            bool(session.execute(statement, publish_params(lane, message)).scalar_one())
            for message in messages
        ]
        if any(kept):
            notify = text(sql.sqlalchemy_text(sql.NOTIFY))
            session.execute(notify, {"channel": schema.WAKE_CHANNEL, "payload": key})
        return kept

    async def stats(self, lane: Lane) -> LaneStats:
        """For a group, `pending` also counts the matching events not yet copied to it, and
        `oldest_ms` their first one's emit time. `oldest_ms` leaves out rows not due yet;
        `stored` is the lane's sequence (see schema.COUNTER_DDL: every row ever inserted for the
        lane, a publish, a requeue, an event copied to a group, rolled back or not). A lane of
        more than sql.STATS_EXACT_ROWS rows is counted by estimate (`approximate`): its
        `pending` from the planner's statistics, its `in_flight` and `oldest_ms` from the head
        of its claim index, so that reading it never scans the lane."""
        key = lane_key(lane)
        params = {"lane": key, "counter": sql.counter_of(key), "cap": sql.STATS_EXACT_ROWS + 1}
        async with self._using(f"cannot read {key}") as connection:
            (rows,) = await one(await connection.execute(sql.LANE_ROWS, params))
            approximate = rows > sql.STATS_EXACT_ROWS
            if approximate:  # counted by estimate (sql.STATS_EXACT_ROWS)
                cursor = await connection.execute(sql.STATS_HEAD, params)
                in_flight, dead, oldest, stored = await one(cursor)
                cursor = await connection.execute(sql.ROWS_ESTIMATE, params)
                (plan,) = await one(cursor)
                pending = max(rows, int(plan[0]["Plan"]["Plan Rows"])) - in_flight
            else:
                cursor = await connection.execute(sql.STATS, params)
                pending, in_flight, dead, oldest, stored = await one(cursor)
            if lane.kind == "group":
                pattern = sql.pattern_regex(lane.subject)
                cursor = await connection.execute(sql.UNCOPIED, {"lane": key, "pattern": pattern})
                uncopied, first_emitted = await one(cursor)
                pending += uncopied
                if first_emitted is not None:
                    oldest = first_emitted if oldest is None else min(oldest, first_emitted)
        return LaneStats(
            pending=int(pending),
            in_flight=int(in_flight),
            dlq=int(dead),
            oldest_ms=None if oldest is None else int(oldest),
            stored=int(stored),
            approximate=approximate,
        )

    def receiver(self, lane: Lane, *, consumer: str) -> Receiver:
        receiver = PostgresReceiver(self, lane, consumer)
        self._receivers.add(receiver)
        return receiver
