"""The transactional outbox: an event or a job written in the same transaction as the data it
is about.

    with db.sessions.begin() as session:          # or inside `await ctx.db.run(fn)`
        session.add(Signup(email=email))
        outbox.add(session, UserSignedUp, {"email": email})
        outbox.enqueue(session, SendReceipt, {"email": email})
    # committed: the event and the job exist and a relay will publish them; rolled back: they
    # never existed

Publishing after the commit loses the event when the process dies in between; publishing before
it announces something that may roll back. Here the event is a row of `mega_outbox` until a
relay (`mega.transactional.relay`) publishes it with `Nats-Msg-Id` = the event id and marks it.
A job is a row likewise (subject `jobs.<job name>`), which the relay enqueues with the job id as its
dedup id: a relay that dies after the enqueue and before the mark enqueues it again, and the
bus drops the copy within its dedup window.

A commit that added outbox rows wakes the relays of this process at once (`on_commit`); the
others find the rows within their poll interval.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import BigInteger, DateTime, Index, Integer, String, Text, event, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from mega import tracing
from mega.database import Base
from mega.drivers.base import Message, Priority
from mega.events.spec import EventBase, encode_event, validate_event
from mega.jobs.spec import JobBase, due_ms_of, encode_job, validate_job

# Set on a session by `add`, read after its commit to wake this process's relays.
SESSION_FLAG = "mega_outbox_added"
# How a row stores its event (since the table was made): the subject is `events.<name>`, and
# the headers hold the event id and when it was emitted (epoch ms).
SUBJECT_PREFIX = "events."
HEADER_ID = "Nats-Msg-Id"
HEADER_EMITTED_AT = "Mega-Emitted-At"
# A job's row: subject `jobs.<job name>`, and its id, due time, key and band in the headers
# (the row's own id is HEADER_ID, a fresh one: a job id may come again, as a dedup key).
JOB_SUBJECT_PREFIX = "jobs."
HEADER_JOB_ID = "Mega-Job-Id"
HEADER_RUN_AT = "Mega-Run-At"
HEADER_KEY = "Mega-Key"
HEADER_PRIORITY = "Mega-Priority"


def row_message(event_id: str, subject: str, body: bytes, headers: dict[str, str]) -> Message:
    """The event a stored row holds, as the relay publishes it (`trace`: the context of the
    `outbox.add` that wrote it, when it was traced)."""
    return Message(
        event_id,
        subject.removeprefix(SUBJECT_PREFIX),
        body,
        int(headers[HEADER_EMITTED_AT]),
        trace=tracing.carried(headers),
    )


def job_of_row(subject: str) -> str | None:
    """The job name a row's subject names (None: the row holds an event)."""
    if subject.startswith(JOB_SUBJECT_PREFIX):
        return subject.removeprefix(JOB_SUBJECT_PREFIX)
    return None


def row_job(job_subject: str, body: bytes, headers: dict[str, str]) -> Message:
    """The job a stored row holds, as the relay enqueues it on `job_subject` (its job's), with
    its id as the dedup id."""
    run_at = headers.get(HEADER_RUN_AT)
    return Message(
        headers[HEADER_JOB_ID],
        job_subject,
        body,
        int(headers[HEADER_EMITTED_AT]),
        int(run_at) if run_at else None,
        dedup=True,
        trace=tracing.carried(headers),
        flow_key=headers.get(HEADER_KEY),
        priority=headers.get(HEADER_PRIORITY, "normal"),  # type: ignore[arg-type]
    )


# Relays of this process to wake after a commit that added rows (each a thread-safe callable).
_wakers: set[Callable[[], None]] = set()


class OutboxRow(Base):
    """One event waiting for (or done with) its publish. `seq` orders them by insertion."""

    __tablename__ = "mega_outbox"

    seq: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    bus: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)
    headers: Mapped[str] = mapped_column(Text)  # JSON object
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    __table_args__ = (
        # The relay reads only pending rows, in order: this index holds nothing else, so the
        # rows already published (until they are pruned) cost it nothing.
        Index(
            "ix_mega_outbox_pending",
            "seq",
            postgresql_where=published_at.is_(None),
            sqlite_where=published_at.is_(None),
        ),
        Index("ix_mega_outbox_published_at", "published_at"),
    )


@dataclass(frozen=True)
class OutboxStats:
    """The outbox at an instant: rows waiting for the relay, rows published and not yet pruned,
    and the age of the oldest waiting row (the relay's lag; 0 when none waits)."""

    pending: int
    published: int
    lag_ms: float


class Outbox:
    """`add(session, Event, payload)`: write an event in the caller's transaction."""

    def add(
        self, session: Session, event_cls: type[EventBase], payload: Any, *, id: str | None = None
    ) -> str:
        """Insert the event's row in `session` (nothing is published yet) and return its id.

        Args:
            session: the SQLAlchemy session of the caller's transaction: the event exists if
                and only if it commits.
            event_cls: the Event class; the relay publishes the event on its bus.
            payload: JSON, or the event's `schema`, validated now: a bad one raises EventError
                `event.invalid_payload` and the caller's transaction decides what to do with it.
            id: the event's id and dedup key (default a random one); one given is 1-200
                printable characters without spaces (else EventError `event.invalid_id`).
        """
        spec = _spec_of(event_cls, validate_event)
        now_ms = time.time_ns() // 10**6
        message = encode_event(spec, payload, event_id=id, emitted_at_ms=now_ms)
        headers = {HEADER_ID: message.id, HEADER_EMITTED_AT: str(message.enqueued_at_ms)}
        if tracing.tracer() is not None:
            with tracing.producing(
                "outbox.add", spec.name, system="outbox", ids=[message.id], kind="create"
            ) as trace:
                headers.update(trace or {})
        self._insert(
            session,
            message.id,
            spec.bus,
            SUBJECT_PREFIX + message.subject,
            message.body,
            headers,
            now_ms,
        )
        return message.id

    def enqueue(
        self,
        session: Session,
        job_cls: type[JobBase],
        payload: Any,
        *,
        id: str | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        key: str | None = None,
        priority: Priority | None = None,
    ) -> str:
        """Insert the job's row in `session` (nothing is enqueued yet) and return its job id.

        After the commit a relay (in `mega worker`) enqueues it on the job's bus, any driver,
        with the job id as its dedup id; a rollback leaves nothing. The arguments are checked
        now: a bad payload, id, delay, key or priority raises JobError and the caller's
        transaction decides what to do with it. (On the postgres driver,
        `enqueue(..., session=session)` writes the job itself in the transaction, no relay.)

        Args:
            session: the SQLAlchemy session of the caller's transaction.
            job_cls: the Job class; a relay whose config declares it (`jobs = [...]`) enqueues
                it on its bus, and the row waits until one does.
            payload: as `JobQueue.enqueue` takes it.
            id: the job's id and dedup key, as `JobQueue.enqueue` takes it (default a random
                one).
            delay: as `JobQueue.enqueue` takes it, counted from now, not from the relay's
                enqueue.
            run_at: as `JobQueue.enqueue` takes it.
            key: as `JobQueue.enqueue` takes it.
            priority: as `JobQueue.enqueue` takes it.
        """
        spec = _spec_of(job_cls, validate_job)
        now_ms = time.time_ns() // 10**6
        message = encode_job(
            spec,
            payload,
            job_id=id,
            due_ms=due_ms_of(spec, delay, run_at, now_ms),
            now_ms=now_ms,
            key=key,
            priority=priority,
        )
        row_id = uuid.uuid4().hex
        headers = {HEADER_ID: row_id, HEADER_EMITTED_AT: str(now_ms), HEADER_JOB_ID: message.id}
        if message.run_at_ms is not None:
            headers[HEADER_RUN_AT] = str(message.run_at_ms)
        if message.flow_key is not None:
            headers[HEADER_KEY] = message.flow_key
        if message.priority != "normal":
            headers[HEADER_PRIORITY] = message.priority
        if tracing.tracer() is not None:
            with tracing.producing(
                "outbox.enqueue", spec.name, system="outbox", ids=[message.id], kind="create"
            ) as trace:
                headers.update(trace or {})
        self._insert(
            session, row_id, spec.bus, JOB_SUBJECT_PREFIX + spec.name, message.body, headers, now_ms
        )
        return message.id

    def _insert(
        self,
        session: Session,
        row_id: str,
        bus: str,
        subject: str,
        body: bytes,
        headers: dict[str, str],
        now_ms: int,
    ) -> None:
        session.add(
            OutboxRow(
                event_id=row_id,
                bus=bus,
                subject=subject,
                body=body.decode(),
                headers=json.dumps(headers),
                created_at=datetime.fromtimestamp(now_ms / 1000, UTC),
            )
        )
        session.info[SESSION_FLAG] = True

    def stats(self, session: Session) -> OutboxStats:
        """Counts and lag, for consoles and health pages.

        Args:
            session: a SQLAlchemy session on the database that holds the outbox.
        """
        pending = OutboxRow.published_at.is_(None)
        waiting, oldest = session.execute(
            select(func.count(), func.min(OutboxRow.created_at)).where(pending)
        ).one()
        published = session.scalar(select(func.count()).where(~pending)) or 0
        lag_ms = 0.0
        if oldest is not None:
            oldest = oldest if oldest.tzinfo else oldest.replace(tzinfo=UTC)
            lag_ms = max(0.0, (datetime.now(UTC) - oldest).total_seconds() * 1000)
        return OutboxStats(int(waiting), int(published), round(lag_ms, 1))

    def pending_ids(self, session: Session, event_ids: Collection[str]) -> set[str]:
        """Which of these events still wait for the relay (the others were published).

        Args:
            session: a SQLAlchemy session on the database that holds the outbox.
            event_ids: ids that `add` returned; none asks nothing of the database.
        """
        if not event_ids:
            return set()
        rows = session.scalars(
            select(OutboxRow.event_id).where(
                OutboxRow.event_id.in_(list(event_ids)), OutboxRow.published_at.is_(None)
            )
        )
        return set(rows)


outbox = Outbox()


def on_commit(waker: Callable[[], None]) -> Callable[[], None]:
    """Call `waker` (from the committing thread) after every commit that added outbox rows.
    Returns a function that unregisters it."""
    _wakers.add(waker)
    return lambda: _wakers.discard(waker)


_specs: dict[type[Any], Any] = {}
S = TypeVar("S")


def _spec_of(cls: type[Any], validate: Callable[[Any, set[str]], S]) -> S:
    """The validated spec of an Event or Job class, made once. Its bus alias is checked
    against the config at boot (`events = [...]`, `jobs = [...]`); here any will do."""
    spec: S | None = _specs.get(cls)
    if spec is None:
        spec = _specs[cls] = validate(cls, {getattr(cls, "bus", "")})
    return spec


@event.listens_for(Session, "after_commit")
def _wake_relays(session: Session) -> None:
    if session.info.pop(SESSION_FLAG, False):
        for waker in list(_wakers):
            waker()


@event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(SESSION_FLAG, None)
