"""The audit of console actions: who did what, to which ids, when (the table `mega_audit`).

Every action of the console (mega.web.admin), of the sample's pages and of the control
commands (`mega dlq`, `mega jobs`, `mega schedules`) writes one row of `mega_audit`: the actor
(`demo`, `token:deploy-bot`, `cli:root@host`), the action (`retry`, `purge`, `pause`...), the
target (`job:EmailJob`, `group:crm-sync`, `schedule:nightly`), the ids it named (at most
MAX_IDS kept) and a detail ("118 dead letters"). The job's page and the overview's schedules
show the rows of theirs; `mega audit list` shows them all, newest first.

    await audited(request, user, "retry", f"job:{lane.name}", [job_id])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import DateTime, Index, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from mega.database import Base, Database, as_utc

# Ids kept per row: a bulk action names how many in its detail, and the first ids.
MAX_IDS = 100


class AuditRow(Base):
    __tablename__ = "mega_audit"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(String(80))
    action: Mapped[str] = mapped_column(String(40))
    target: Mapped[str] = mapped_column(String(200))
    ids: Mapped[str] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(String(200), server_default="")

    __table_args__ = (
        Index("ix_mega_audit_target_at", "target", "at"),
        Index("ix_mega_audit_at", "at"),
    )


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    actor: str
    action: str
    target: str
    ids: tuple[str, ...]
    detail: str

    def describe(self) -> str:
        """One line: `2026-12-05T12:00:00+00:00 demo purge job:EmailJob (118 dead letters)`."""
        ids = f" {', '.join(self.ids)}" if self.ids else ""
        detail = f" ({self.detail})" if self.detail else ""
        at = self.at.isoformat(timespec="seconds")
        return f"{at}\t{self.actor}\t{self.action}\t{self.target}{ids}{detail}"


def record(
    db: Session, actor: str, action: str, target: str, ids: Sequence[str] = (), detail: str = ""
) -> None:
    """Add one row in `db`'s transaction."""
    db.add(
        AuditRow(
            at=datetime.now(UTC),
            actor=actor[:80],
            action=action[:40],
            target=target[:200],
            ids=json.dumps(list(ids[:MAX_IDS])),
            detail=detail[:200],
        )
    )


async def write(
    database: Database,
    actor: str,
    action: str,
    target: str,
    ids: Sequence[str] = (),
    detail: str = "",
) -> None:
    """One row, in a transaction of its own."""
    await database.run(lambda db: record(db, actor, action, target, ids, detail))


def entries(
    db: Session, *, target: str | None = None, job_id: str | None = None, limit: int = 50
) -> list[AuditEntry]:
    """The newest rows first, of one target and naming one id when given."""
    query = select(AuditRow).order_by(AuditRow.at.desc(), AuditRow.id.desc())
    if target is not None:
        query = query.where(AuditRow.target == target)
    if job_id is not None:  # a JSON list holds it as a quoted string
        query = query.where(AuditRow.ids.contains(json.dumps(job_id), autoescape=True))
    rows = db.scalars(query.limit(limit))
    return [
        AuditEntry(as_utc(r.at), r.actor, r.action, r.target, tuple(json.loads(r.ids)), r.detail)
        for r in rows
    ]
