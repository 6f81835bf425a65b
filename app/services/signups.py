"""The signup demo's data: the `demo_signups` table and SignupService.sign_up, and the welcome
credits of `demo_credits`.

A signup, its UserSignedUp event and its ActivateAccountJob are written in one transaction: the
row in `demo_signups`, and the event's and the job's rows in the framework's outbox.
`mode="rollback"` raises after the inserts, so none is committed: no listener ever hears of it
and no job runs.

A credit row is written by WelcomeCreditListener (app/events/listeners.py) in the transaction of
its delivery, which commits the event id with it (`inbox = "db"`): one row per signup event,
however often the event is delivered.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import DateTime, Integer, String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from app.events.signups import UserSignedUp
from app.jobs.signup import ActivateAccountJob, activation_id
from mega import Database, outbox

# The signups the page lists.
LISTED = 20
# What every new user is granted once.
WELCOME_CREDITS = 10


class AppBase(DeclarativeBase):
    """The sample's own tables (the framework's are made by its migrations, not here)."""


class Signup(AppBase):
    __tablename__ = "demo_signups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(254))
    event_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Credit(AppBase):
    __tablename__ = "demo_credits"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    signup_id: Mapped[int] = mapped_column(Integer)
    event_id: Mapped[str] = mapped_column(String(64))  # not unique: the inbox keeps it single
    amount: Mapped[int] = mapped_column(Integer)
    granted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def grant_welcome_credits(session: Session, signup_id: int, event_id: str) -> None:
    """Add the signup's welcome credits in the caller's transaction."""
    now = datetime.now(UTC)
    session.add(
        Credit(signup_id=signup_id, event_id=event_id, amount=WELCOME_CREDITS, granted_at=now)
    )


class RolledBack(Exception):
    """What mode "rollback" raises after both inserts, to undo them."""


@dataclass(frozen=True)
class SignupResult:
    committed: bool
    signup_id: int | None
    event_id: str | None


def create_tables(db: Database) -> None:
    """The demo's table, if missing (called when the web app starts)."""
    AppBase.metadata.create_all(db.engine)


class SignupService:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def sign_up(self, email: str, mode: Literal["ok", "rollback"]) -> SignupResult:
        """Insert the signup and its event in one transaction (or in none, for "rollback")."""

        def transaction(session: Session) -> SignupResult:
            signup = Signup(email=email, event_id="", created_at=datetime.now(UTC))
            session.add(signup)
            session.flush()  # the row's id, for the event
            signup.event_id = outbox.add(
                session, UserSignedUp, {"signup_id": signup.id, "email": email}
            )
            # The signup's own job, in the same transaction: it exists exactly when the
            # signup commits, and the relay enqueues it with the event.
            outbox.enqueue(
                session,
                ActivateAccountJob,
                {"signup_id": signup.id},
                id=activation_id(signup.event_id),
            )
            if mode == "rollback":
                raise RolledBack(f"signup {signup.id} rolled back on purpose")
            return SignupResult(True, signup.id, signup.event_id)

        try:
            return await self.db.run(transaction)
        except RolledBack:
            return SignupResult(False, None, None)

    async def credit_rows(self) -> int:
        """How many credit rows the listener wrote (one per committed signup)."""
        return await self.db.run(lambda session: session.scalar(select(func.count(Credit.id))) or 0)

    async def recent(self) -> list[Signup]:
        def query(session: Session) -> list[Signup]:
            rows = session.scalars(select(Signup).order_by(Signup.id.desc()).limit(LISTED))
            return list(rows)

        return await self.db.run(query)
