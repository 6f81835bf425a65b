"""The `RecordStore` part of the Postgres bus (see bus.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mega.drivers.base import (
    Lane,
    Table,
)
from mega.drivers.postgres import sql
from mega.drivers.postgres.common import lane_key
from mega.drivers.postgres.core import PostgresCore

if TYPE_CHECKING:
    pass


class PostgresRecordStore(PostgresCore):
    """The `RecordStore` of the Postgres bus."""

    async def put_records(
        self,
        lane: Lane,
        table: Table,
        records: Sequence[tuple[str, bytes]],
        *,
        create: bool,
        confirm: bool = True,
    ) -> list[bool]:
        """One statement for the batch, on the database's clock; a table kept 0 s is never
        written (nothing will be read). As if written one by one, in order: an overwrite of a
        key twice leaves its last record, a create of a key twice stores its first."""
        keep_s = float(lane.keep_s(table))
        if not records or keep_s <= 0:
            return [True] * len(records)
        key = lane_key(lane)
        # Each key once (a row changes at most once per statement): the record that would last.
        kept = dict(reversed(records)) if create else dict(records)
        params = {
            "lane": key,
            "tbl": table,
            "keep_s": keep_s,
            "keys": list(kept),
            "values": list(kept.values()),
        }
        async with self._using(f"cannot store the {table} records of {key}") as connection:
            cursor = await connection.execute(
                sql.RECORDS_CREATE if create else sql.RECORDS_PUT, params
            )
            if not create:
                return [True] * len(records)
            stored = {row[0] for row in await cursor.fetchall()}
        first: dict[str, int] = {}  # each key's first record, the one a create stores
        for n, (record_key, _) in enumerate(records):
            first.setdefault(record_key, n)
        return [
            record_key in stored and first[record_key] == n
            for n, (record_key, _) in enumerate(records)
        ]

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        if not keys:
            return []
        lane_id = lane_key(lane)
        async with self._using(f"cannot read the {table} records of {lane_id}") as connection:
            cursor = await connection.execute(
                sql.RECORDS_GET, {"lane": lane_id, "tbl": table, "keys": list(keys)}
            )
            found = {key: bytes(value) for key, value in await cursor.fetchall()}
        return [found.get(key) for key in keys]

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        """`WHERE lane AND tbl`: a range of the records' primary key."""
        lane_id = lane_key(lane)
        async with self._using(f"cannot list the {table} records of {lane_id}") as connection:
            cursor = await connection.execute(sql.RECORDS_LIST, {"lane": lane_id, "tbl": table})
            return [(key, bytes(value)) for key, value in await cursor.fetchall()]
