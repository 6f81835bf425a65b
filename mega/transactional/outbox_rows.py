"""The relay's steps on the outbox table (mega/transactional/relay.py), each run on its
thread in its own session: a batch of pending rows taken in insertion order (`FOR UPDATE SKIP
LOCKED` on PostgreSQL, the write lock first on SQLite), the batch marked published and
committed, and published rows past their retention deleted, `PRUNE_BATCH` at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import ColumnElement, and_, delete, select, update
from sqlalchemy.orm import Session

from mega.transactional.store import OutboxRow

# Published rows deleted per statement while pruning.
PRUNE_BATCH = 1000


class Row(NamedTuple):
    """One pending row of the outbox, as the relay publishes it."""

    seq: int
    event_id: str
    bus: str
    subject: str
    body: bytes
    headers: dict[str, str]
    created_at: datetime


def take_batch(session: Session, limit: int, passed_over: set[int]) -> list[Row]:
    waiting: ColumnElement[bool] = OutboxRow.published_at.is_(None)
    if passed_over:
        waiting = and_(waiting, OutboxRow.seq.not_in(passed_over))
    pending = select(OutboxRow.seq).where(waiting).limit(1)
    if session.scalar(pending) is None:
        return []  # nothing to do: no lock taken, writers never wait for an idle relay
    if session.get_bind().dialect.name == "sqlite":
        # SQLite has no row locks: take the database's write lock now, so that relays in other
        # processes wait for this batch to be marked instead of publishing the same rows.
        session.execute(update(OutboxRow).where(OutboxRow.seq == -1).values(seq=OutboxRow.seq))
    columns = (
        OutboxRow.seq,
        OutboxRow.event_id,
        OutboxRow.bus,
        OutboxRow.subject,
        OutboxRow.body,
        OutboxRow.headers,
        OutboxRow.created_at,
    )
    rows = session.execute(
        select(*columns)
        .where(waiting)
        .order_by(OutboxRow.seq)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    return [
        Row(seq, event_id, bus, subject, body.encode(), json.loads(headers), created_at)
        for seq, event_id, bus, subject, body, headers, created_at in rows
    ]


def mark_published(session: Session, seqs: list[int]) -> None:
    session.execute(
        update(OutboxRow).where(OutboxRow.seq.in_(seqs)).values(published_at=datetime.now(UTC))
    )
    session.commit()
    session.close()


def end(session: Session, *, commit: bool) -> None:
    if commit:
        session.commit()
    else:
        session.rollback()
    session.close()


def prune_some(sessions: Callable[[], Session], cutoff: datetime) -> int:
    with sessions.begin() as session:  # type: ignore[attr-defined]
        oldest = (
            select(OutboxRow.seq)
            .where(OutboxRow.published_at.is_not(None), OutboxRow.published_at < cutoff)
            .order_by(OutboxRow.seq)
            .limit(PRUNE_BATCH)
        )
        result = session.execute(delete(OutboxRow).where(OutboxRow.seq.in_(oldest)))
        return int(result.rowcount or 0)  # type: ignore[attr-defined]


def aware(value: datetime) -> datetime:
    """`value` with its zone: SQLite hands back naive datetimes; every value stored is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)
