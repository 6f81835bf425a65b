"""The `postgres` bus driver: jobs and events in PostgreSQL tables (psycopg 3, async).

    bus = await PostgresBus.connect("jobs", BusSpec(driver="postgres", url="postgresql://..."))

`PostgresBus` is imported on first use: the framework's migration reads the DDL from
`mega.drivers.postgres.schema` on any database, and must not need psycopg for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mega.drivers.postgres.urls import check_urls

if TYPE_CHECKING:
    from mega.drivers.postgres.bus import PostgresBus

__all__ = ["PostgresBus", "check_urls"]


def __getattr__(name: str) -> Any:
    if name == "PostgresBus":
        from mega.drivers.postgres.bus import PostgresBus

        return PostgresBus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
