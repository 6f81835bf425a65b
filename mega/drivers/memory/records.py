"""The memory bus's record stores (`RecordStore` of mega.drivers.base): a lane's tables in its
broker, each value kept with the monotonic time it expires at."""

from __future__ import annotations

from collections.abc import Sequence

from mega import clock
from mega.drivers.base import Lane, Table
from mega.drivers.memory.broker import MemoryBroker


class MemoryRecordStore:
    """The status records, results, presence and the rest of a MemoryBus, on its `broker`."""

    broker: MemoryBroker

    async def put_records(
        self,
        lane: Lane,
        table: Table,
        records: Sequence[tuple[str, bytes]],
        *,
        create: bool,
        confirm: bool = True,
    ) -> list[bool]:
        store = self.broker.table(lane, table)
        now = clock.monotonic()
        expires = now + lane.keep_s(table)
        stored: list[bool] = []
        for key, value in records:
            kept = store.get(key)
            if create and kept is not None and kept[1] > now:
                stored.append(False)
                continue
            store[key] = (value, expires)
            stored.append(True)
        return stored

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        store, now = self.broker.table(lane, table), clock.monotonic()
        found: list[bytes | None] = []
        for key in keys:
            kept = store.get(key)
            found.append(kept[0] if kept is not None and kept[1] > now else None)
        return found

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        store, now = self.broker.table(lane, table), clock.monotonic()
        return [(key, value) for key, (value, expires) in store.items() if expires > now]
