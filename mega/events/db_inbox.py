"""The transactional inbox: a listener group's database effect and the mark of its event id
commit together, so the effect happens once per event id.

    class SignupLedgerListener(Listener):
        event = UserSignedUp
        inbox = "db"                    # the database of services.database

        async def run(self, event: ReceivedEvent, ctx: Context) -> None:
            await event.db.run(lambda session: session.add(Ledger(event_id=event.id)))

For each delivery the listener worker opens one session of `ctx.db`: one transaction, holding
one pooled connection until the delivery ends. It looks for (group, event id) in `mega_inbox`
first: found, the event was done already and `run` is skipped (a `skip` signal). Otherwise
`run` runs, and `event.db.run(fn)` calls `fn(session)` in a thread inside that transaction, as
`ctx.db.run(fn)` does inside one of its own (the database is synchronous SQLAlchemy: a query
must not block the event loop). When `run` returns, the worker inserts the row and commits: the
effect and the mark are one commit, or neither exists. `run` raising rolls both back, then the
event is retried or dead-lettered as always. A worker killed before the commit leaves nothing
behind; killed after it, the redelivery finds the row and skips.

The primary key (group, event id) is the last guard: two attempts that ran at once both insert
the row and one commit wins; the other is refused by the key, rolls its effect back and counts
as a skip, not a failure.

Rows older than the group's `inbox_ttl_s` are deleted by the listener worker as it goes, at
most every PRUNE_EVERY_S per group and process, PRUNE_BATCH rows per statement.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread
from sqlalchemy import DateTime, Index, String, delete, insert, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from mega.database import Base

if TYPE_CHECKING:
    from mega.database import Database

T = TypeVar("T")

logger = logging.getLogger("mega.listeners")

# Expired rows deleted per statement, and how often one process prunes a group's rows: a row is
# read only by a redelivery of its event, so pruning it minutes late costs bytes, not correctness.
PRUNE_BATCH = 1000
PRUNE_EVERY_S = 600.0


class InboxRow(Base):
    """An event id a listener group completed, committed with the group's effect."""

    __tablename__ = "mega_inbox"

    group_name: Mapped[str] = mapped_column(String(255), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    done_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_mega_inbox_group_done_at", "group_name", "done_at"),)


class InboxTransaction:
    """The transaction of one delivery to a group with `inbox = "db"`: `event.db`."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._turn = asyncio.Lock()  # a Session is used by one thread at a time

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run `fn(session)` in a thread inside the delivery's transaction; returns its result.

        Nothing is committed here: the listener worker commits once `run` returns, with the
        event id. Several calls share the transaction, one after the other."""
        async with self._turn:
            return await anyio.to_thread.run_sync(fn, self.session)


class DbInbox:
    """The completed event ids of one listener group, in the `mega_inbox` table."""

    def __init__(self, db: Database, group: str, ttl_s: int) -> None:
        self.db = db
        self.group = group
        self.ttl_s = ttl_s
        self._pruned_at: float | None = None  # monotonic

    async def deliver(
        self, event_id: str, run: Callable[[InboxTransaction], Awaitable[None]]
    ) -> bool:
        """`run(transaction)`, then the mark of `event_id`, in one transaction: True when it
        committed, False when the group had completed the event already (nothing committed).
        `run` raising rolls everything back and raises."""
        transaction = InboxTransaction(self.db.sessions())
        try:
            if await transaction.run(functools.partial(self._done, event_id=event_id)):
                return False
            await run(transaction)
            return await transaction.run(functools.partial(self._commit, event_id=event_id))
        finally:
            await transaction.run(Session.close)  # rolls back what did not commit

    async def prune_now_and_then(self) -> None:
        """`prune()` when the last one was PRUNE_EVERY_S ago; a failure is logged, never
        raised (the delivery that called it has committed)."""
        now = time.monotonic()
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        try:
            await self.prune()
        except Exception as exc:
            logger.warning("%s: cannot prune its inbox rows: %s", self.group, exc)

    async def prune(self) -> int:
        """Delete the group's rows older than `ttl_s`, PRUNE_BATCH per statement; how many."""
        cutoff = datetime.now(UTC) - timedelta(seconds=self.ttl_s)
        total = 0
        while True:
            deleted = await anyio.to_thread.run_sync(self._prune_some, cutoff)
            total += deleted
            if deleted < PRUNE_BATCH:
                return total

    def _done(self, session: Session, event_id: str) -> bool:
        found = session.scalar(
            select(InboxRow.event_id).where(
                InboxRow.group_name == self.group, InboxRow.event_id == event_id
            )
        )
        return found is not None

    def _commit(self, session: Session, event_id: str) -> bool:
        session.flush()  # the effect's own errors are the listener's failure, raised here
        row = {"group_name": self.group, "event_id": event_id, "done_at": datetime.now(UTC)}
        try:
            session.execute(insert(InboxRow).values(row))
        except IntegrityError:  # another attempt committed this event id meanwhile
            session.rollback()
            return False
        session.commit()
        return True

    def _prune_some(self, cutoff: datetime) -> int:
        key = tuple_(InboxRow.group_name, InboxRow.event_id)
        oldest = (
            select(InboxRow.group_name, InboxRow.event_id)
            .where(InboxRow.group_name == self.group, InboxRow.done_at < cutoff)
            .limit(PRUNE_BATCH)
        )
        with self.db.sessions.begin() as session:
            result = session.execute(delete(InboxRow).where(key.in_(oldest)))
            return int(result.rowcount or 0)  # type: ignore[attr-defined]
