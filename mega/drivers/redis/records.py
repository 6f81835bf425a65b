"""The `RecordStore` part of the Redis bus (see bus.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from mega.drivers.base import (
    DriverUnavailable,
    Lane,
    Table,
)
from mega.drivers.redis.client import (
    OUTAGES,
)
from mega.drivers.redis.core import RedisCore, index_records
from mega.drivers.redis.lanes import (
    as_text,
    lane_keys,
)


class RedisRecordStore(RedisCore):
    """The `RecordStore` of the Redis bus."""

    async def put_records(
        self,
        lane: Lane,
        table: Table,
        records: Sequence[tuple[str, bytes]],
        *,
        create: bool,
        confirm: bool = True,
    ) -> list[bool]:
        """One SET per record with the lane's keep as its expiry (NX for a create: Redis
        answers nothing when the key exists), all in one pipeline, run in order. A table kept
        0 s is never written (nothing will be read)."""
        keep_ms = round(lane.keep_s(table) * 1000)
        if not records or keep_ms <= 0:
            return [True] * len(records)
        keys = lane_keys(lane)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, value in records:
                    pipe.set(keys.record(table, key), value, px=keep_ms, nx=create)
                if table == "workers":  # listed: see `list_records`
                    index_records(pipe, keys, table, records, keep_ms)
                answers: list[Any] = await pipe.execute()
            answers = answers[: len(records)]
        except OUTAGES as exc:
            raise DriverUnavailable(
                f"cannot store the {table} records of {lane.name}: {exc}"
            ) from exc
        return [bool(answer) for answer in answers]

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        if not keys:
            return []
        names = lane_keys(lane)
        try:
            values = await self.redis.mget([names.record(table, key) for key in keys])
        except OUTAGES as exc:
            raise DriverUnavailable(
                f"cannot read the {table} records of {lane.name}: {exc}"
            ) from exc
        return cast(list[bytes | None], values)  # bytes: the client decodes no responses

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        """The keys of the table's index (a sorted set `<own>:<table>`, each key scored with
        its expiry, written with the "workers" records), the expired ones dropped on this
        read, then their values: two round trips. Only the "workers" table is indexed."""
        keys = lane_keys(lane)
        index = keys.record_index(table)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(index, "-inf", int(time.time() * 1000))
                pipe.zrange(index, 0, -1)
                _, names = await pipe.execute()
            if not names:
                return []
            found = [as_text(name) for name in names]
            values = cast(
                list[bytes | None],  # bytes: the client decodes no responses
                await self.redis.mget([keys.record(table, name) for name in found]),
            )
        except OUTAGES as exc:
            raise DriverUnavailable(
                f"cannot list the {table} records of {lane.name}: {exc}"
            ) from exc
        return [
            (name, value) for name, value in zip(found, values, strict=True) if value is not None
        ]
