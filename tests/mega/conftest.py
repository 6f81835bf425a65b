"""Fixtures shared by the framework's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], Redis]]:
    """Make redis.asyncio clients (`clients(url)`) that are closed after the test."""
    made: list[Redis] = []

    def make(url: str) -> Redis:
        made.append(Redis.from_url(url))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()
