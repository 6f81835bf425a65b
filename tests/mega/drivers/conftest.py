"""What the driver tests share: a NatsBus on the session's nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mega.drivers.nats.bus import NatsBus
from mega.settings import BusSpec


@pytest.fixture
async def nats_bus(nats_url: str) -> AsyncIterator[NatsBus]:
    """The `jobs` bus on the session's nats-server, closed after the test."""
    bus = await NatsBus.connect("jobs", BusSpec(driver="nats", url=nats_url))
    try:
        yield bus
    finally:
        await bus.close()
