"""The `DeadLetterStore` part of the Postgres bus (see bus.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mega.drivers.base import (
    DlqRecord,
    Lane,
)
from mega.drivers.postgres import schema, sql
from mega.drivers.postgres.common import lane_key
from mega.drivers.postgres.core import PostgresCore, job_body, one, stored_key

if TYPE_CHECKING:
    pass


class PostgresDeadLetters(PostgresCore):
    """The `DeadLetterStore` of the Postgres bus."""

    async def dead_letters(
        self, lane: Lane, *, limit: int, before: int | None = None
    ) -> list[DlqRecord]:
        """`WHERE lane = %s AND seq < %s ORDER BY seq DESC LIMIT %s`: a range of the
        (lane, seq) index, as fast on the last page as on the first."""
        key = lane_key(lane)
        params = {"lane": key, "limit": limit, "before": 2**63 - 1 if before is None else before}
        async with self._using(f"cannot read the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_LIST, params)
            rows = await cursor.fetchall()
        records: list[DlqRecord] = []
        for seq, record in rows:
            record["seq"] = int(seq)
            records.append(record)
        return records

    async def dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        """Through the index on (lane, the record's id)."""
        key = lane_key(lane)
        async with self._using(f"cannot read the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_GET, {"lane": key, "job_id": job_id})
            row = await cursor.fetchone()
        if row is None:
            return None
        seq, record = row
        record["seq"] = int(seq)
        found: DlqRecord = record
        return found

    async def delete_dead(self, lane: Lane, seq: int) -> bool:
        key = lane_key(lane)
        async with self._using(f"cannot delete a dead letter of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_DELETE, {"lane": key, "seq": seq})
        return cursor.rowcount > 0

    async def count_dead(self, lane: Lane) -> int:
        key = lane_key(lane)
        async with self._using(f"cannot count the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_COUNT, {"lane": key})
            (count,) = await one(cursor)
        return int(count)

    async def requeue(self, lane: Lane, record: DlqRecord) -> None:
        """A record listed here (with its `seq`) that is gone already (requeued or purged
        meanwhile) is not stored again; one without `seq` is stored."""
        key = lane_key(lane)
        async with (
            self._using(f"cannot requeue into {key}") as connection,
            connection.transaction(),
        ):
            if "seq" in record:
                cursor = await connection.execute(
                    sql.DEAD_TAKE, {"lane": key, "seq": record["seq"]}
                )
                if await cursor.fetchone() is None:
                    return
            await connection.execute(
                sql.REQUEUE,
                {
                    "lane": key,
                    "job_id": record["id"],
                    "subject": record["subject"],
                    "body": job_body(record),
                    "enqueued_at_ms": record.get("first_enqueued_at") or int(time.time() * 1000),
                    "flow_key": stored_key(lane, record.get("flow_key")),
                    # A prioritized lane's claim reads its rows by band: a dead letter keeps
                    # no band, and comes back in the normal one.
                    "priority": "normal" if lane.prioritized else None,
                },
            )
            await connection.execute(sql.NOTIFY, {"channel": schema.WAKE_CHANNEL, "payload": key})

    async def purge(self, lane: Lane) -> int:
        key = lane_key(lane)
        async with self._using(f"cannot purge the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_PURGE, {"lane": key})
        return max(cursor.rowcount, 0)
