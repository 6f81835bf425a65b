"""The `DeadLetterStore` part of the Redis bus (see bus.py)."""

from __future__ import annotations

import json
import time
from typing import Any, cast

from mega.drivers.base import (
    DlqRecord,
    DriverUnavailable,
    Lane,
)
from mega.drivers.redis.client import (
    OUTAGES,
    queue_script,
)
from mega.drivers.redis.core import RedisCore
from mega.drivers.redis.lanes import (
    LaneKeys,
    as_text,
    entry_of,
    lane_keys,
    parse_record,
)
from mega.drivers.redis.scripts import (
    EVENT_SUBJECT_PREFIX,
)


class RedisDeadLetters(RedisCore):
    """The `DeadLetterStore` of the Redis bus."""

    async def dead_letters(
        self, lane: Lane, *, limit: int, before: int | None = None
    ) -> list[DlqRecord]:
        """XREVRANGE from the newest, or from the entry of `before` exclusive (`(<id>`): a
        range read of the stream, as fast on the last page as on the first."""
        top = "+" if before is None else "(" + entry_of(before)
        try:
            entries: Any = await self.redis.xrevrange(
                lane_keys(lane).dlq, max=top, min="-", count=limit
            )
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot read the dead letters of {lane.name}: {exc}") from exc
        return [parse_record(entry_id, fields) for entry_id, fields in entries]

    async def dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        """The entry the index (`<dlq>:ids`, written with each record) names, then that one
        entry. Dead letters stored before the index existed are indexed once, on the first
        look-up that finds no index at all."""
        keys = lane_keys(lane)
        try:
            entry_id = await self.redis.hget(keys.dlq_index, job_id)
            if entry_id is None and await self._index_unindexed(keys):
                entry_id = await self.redis.hget(keys.dlq_index, job_id)
            if entry_id is None:
                return None
            entries: Any = await self.redis.xrange(keys.dlq, min=entry_id, max=entry_id)
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot read the dead letters of {lane.name}: {exc}") from exc
        return parse_record(*entries[0]) if entries else None

    async def _index_unindexed(self, keys: LaneKeys) -> bool:
        """Index every record when the stream has records and no index (records of before
        the index); False when there was nothing to do."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(keys.dlq_index)
            pipe.xlen(keys.dlq)
            indexed, length = await pipe.execute()
        if indexed or not length:
            return False
        start = "-"
        while entries := cast(Any, await self.redis.xrange(keys.dlq, min=start, count=1000)):
            newest = {parse_record(e, f)["id"]: as_text(e) for e, f in entries}
            await self.redis.hset(keys.dlq_index, mapping=newest)  # type: ignore[arg-type]
            start = "(" + as_text(entries[-1][0])
        return True

    async def delete_dead(self, lane: Lane, seq: int) -> bool:
        keys = lane_keys(lane)
        entry_id = entry_of(seq)
        try:
            entries: Any = await self.redis.xrange(keys.dlq, min=entry_id, max=entry_id)
            if not entries:
                return False
            job_id = parse_record(*entries[0])["id"]
            deleted = await self._drop(keys=[keys.dlq, keys.dlq_index], args=[entry_id, job_id])
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot delete a dead letter of {lane.name}: {exc}") from exc
        return bool(deleted)

    async def count_dead(self, lane: Lane) -> int:
        try:
            return int(await self.redis.xlen(lane_keys(lane).dlq))
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot read the dead letters of {lane.name}: {exc}") from exc

    async def requeue(self, lane: Lane, record: DlqRecord) -> None:
        """A new entry on the lane's own stream with `base` 0 (the attempt reset), and the
        record deleted. A record's `seq` is only the millisecond of its entry, so the entry is
        the one of that millisecond (or, without `seq`, the newest) with the record's job id.
        A record no longer there (requeued meanwhile) is requeued all the same. On a durable
        lane it returns once a replica has the new entry, as `publish` does."""
        keys = lane_keys(lane)
        now = int(time.time() * 1000)
        subject = str(record.get("subject") or lane.subject)
        fields: dict[Any, Any] = {
            "id": record["id"],
            "body": json.dumps(record["payload"], separators=(",", ":")),
            "enqueued_at": record.get("first_enqueued_at") or now,
            "run_at": now,
            "base": 0,  # a new entry with no earlier attempts: that is the attempt reset
            # A group's entry is matched and named by its subject (`events.<name>`).
            "subject": EVENT_SUBJECT_PREFIX + subject.removeprefix(EVENT_SUBJECT_PREFIX)
            if lane.kind == "group"
            else subject,
        }
        if "flow_key" in record:
            fields["flow_key"] = record["flow_key"]
        try:
            entry_id = await self._find_record(keys, record)
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot requeue on {lane.name}: {exc}") from exc
        entry = [part for pair in fields.items() for part in pair]

        async def queue(pipe: Any) -> None:
            if entry_id is None:
                pipe.execute_command("XADD", keys.own, "*", *entry)
            else:  # the new entry and the record's deletion in one step
                await queue_script(
                    pipe,
                    self._requeue,
                    [keys.dlq, keys.dlq_index, keys.own],
                    [as_text(entry_id), record["id"], *entry],
                )

        await self.write(lane, keys, queue, f"cannot requeue on {lane.name}")

    async def _find_record(self, keys: LaneKeys, record: DlqRecord) -> Any:
        """The record's entry: the one its `seq` names, else the newest of its id (index)."""
        seq = record.get("seq")
        entry_id: Any = entry_of(seq) if seq is not None else None
        if entry_id is None:
            entry_id = await self.redis.hget(keys.dlq_index, record["id"])
            if entry_id is None:
                return None
        entries: Any = await self.redis.xrange(keys.dlq, min=entry_id, max=entry_id)
        for found, raw in entries:
            if parse_record(found, raw)["id"] == record["id"]:
                return found
        return None

    async def purge(self, lane: Lane) -> int:
        key = lane_keys(lane).dlq
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xlen(key)
                pipe.delete(key, lane_keys(lane).dlq_index)
                count, _ = await pipe.execute()
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot purge the dead letters of {lane.name}: {exc}") from exc
        return int(count)
