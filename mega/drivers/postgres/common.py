"""What the bus and its receivers share: how a connection is opened, and names."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import make_conninfo

from mega.drivers.base import Lane

Connection = psycopg.AsyncConnection[tuple[Any, ...]]

# Bounds the connect of `connect()` and of every reconnect after an outage.
CONNECT_TIMEOUT_S = 5.0
# How long the LISTEN connection waits before connecting again after losing the server.
LISTEN_RETRY_S = 1.0
# A server cut off by the network is noticed by the kernel instead of after its default of
# about two hours idle (or fifteen minutes of retransmits): keepalive probes from 5 s idle, one
# every 2 s, three missed; sent data unacknowledged for 10 s. libpq's names and units.
TCP_FAULT_SETTINGS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


async def open_connection(url: str) -> Connection:
    """One autocommit connection (each statement its own transaction, unless in a block)."""
    connection: Connection = await asyncio.wait_for(
        psycopg.AsyncConnection.connect(
            make_conninfo(url, **TCP_FAULT_SETTINGS),
            autocommit=True,
            connect_timeout=int(CONNECT_TIMEOUT_S),
            application_name="mega",
        ),
        timeout=CONNECT_TIMEOUT_S + 1,
    )
    return connection


def redact(url: str) -> str:
    """The URL with its password hidden, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[2]}"))


def one_line(exc: BaseException) -> str:
    """An error as one short line (libpq's messages span several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def lane_key(lane: Lane) -> str:
    """The lane's name in the tables and its NOTIFY payload."""
    return f"job:{lane.subject}" if lane.kind == "job" else f"group:{lane.name}"
