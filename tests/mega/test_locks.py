"""app.mega.locks against real Redis servers (the session one, and private ones to stop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis

from app.mega.embedded import EmbeddedServer
from app.mega.locks import LockBackendError, RedLock


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], Redis]]:
    """Make redis.asyncio clients that are closed after the test."""
    made: list[Redis] = []

    def make(url: str) -> Redis:
        made.append(Redis.from_url(url))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


@pytest.fixture
def lock(redis_url: str, clients: Callable[[str], Redis]) -> RedLock:
    return RedLock("main", [clients(redis_url)])


async def test_acquire_is_exclusive_until_released(lock: RedLock, prefix: str) -> None:
    token = await lock.acquire(f"{prefix}:a", 5_000)
    assert isinstance(token, str) and len(token) == 32
    assert await lock.acquire(f"{prefix}:a", 5_000) is None
    assert await lock.release(f"{prefix}:a", token) is True
    again = await lock.acquire(f"{prefix}:a", 5_000)
    assert again is not None and again != token


async def test_release_with_a_foreign_token_deletes_nothing(lock: RedLock, prefix: str) -> None:
    token = await lock.acquire(f"{prefix}:a", 5_000)
    assert token is not None
    assert await lock.release(f"{prefix}:a", "not-our-token") is False
    assert await lock.native.get(f"{prefix}:a") == token.encode()
    assert await lock.release(f"{prefix}:a", token) is True
    assert await lock.release(f"{prefix}:a", token) is False  # already gone


async def test_ttl_expiry_frees_the_lock_and_a_late_release_spares_the_new_holder(
    lock: RedLock, prefix: str
) -> None:
    old = await lock.acquire(f"{prefix}:a", 100)
    assert old is not None
    await asyncio.sleep(0.25)
    new = await lock.acquire(f"{prefix}:a", 5_000)
    assert new is not None
    assert await lock.release(f"{prefix}:a", old) is False
    assert await lock.native.get(f"{prefix}:a") == new.encode()


async def test_incr_counts_up(lock: RedLock, prefix: str) -> None:
    assert [await lock.incr(f"{prefix}:fence") for _ in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("ttl_ms", [0, -1, True, 1.5, "1000"])
async def test_ttl_must_be_a_positive_int(lock: RedLock, prefix: str, ttl_ms: object) -> None:
    with pytest.raises(ValueError, match="ttl_ms"):
        await lock.acquire(f"{prefix}:a", ttl_ms)  # type: ignore[arg-type]


async def test_single_server_down_raises_lock_backend_error(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    server = redis_factory()
    lock = RedLock("main", [clients(server.url)])
    assert await lock.acquire("k", 1_000) is not None
    server.stop()
    for attempt in (lock.acquire("k2", 1_000), lock.release("k", "t"), lock.incr("f")):
        with pytest.raises(LockBackendError) as caught:
            await attempt
        assert caught.value.code == "lock.backend"
        assert f"127.0.0.1:{server.port}" in caught.value.message
        assert "lock 'main'" in caught.value.message


async def test_quorum_of_three(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    servers = [redis_factory() for _ in range(3)]
    lock = RedLock("quorum", [clients(server.url) for server in servers])
    assert lock.quorum == 2

    token = await lock.acquire("k", 5_000)
    assert token is not None
    assert [await client.get("k") for client in lock.clients] == [token.encode()] * 3
    assert await lock.acquire("k", 5_000) is None
    assert await lock.release("k", token) is True

    servers[0].stop()  # a minority down: still a quorum
    token = await lock.acquire("k", 5_000)
    assert token is not None
    assert await lock.acquire("k", 5_000) is None
    assert await lock.release("k", token) is True

    servers[1].stop()  # a majority down: an error naming the servers, never a false "held"
    with pytest.raises(LockBackendError) as caught:
        await lock.acquire("k", 5_000)
    assert "only 1 of 3" in caught.value.message
    assert f":{servers[0].port}/" in caught.value.message
    assert f":{servers[1].port}/" in caught.value.message
    assert await lock.clients[2].get("k") is None  # the partial hold was released


async def test_quorum_contested_by_another_holder(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    lock = RedLock("quorum", [clients(redis_factory().url) for _ in range(3)])
    await lock.clients[0].set("one", "theirs")
    token = await lock.acquire("one", 5_000)  # 2 of 3 is a majority
    assert token is not None
    assert await lock.release("one", token) is True
    assert await lock.clients[0].get("one") == b"theirs"

    await lock.clients[0].set("two", "theirs")
    await lock.clients[1].set("two", "theirs")
    assert await lock.acquire("two", 5_000) is None
    assert await lock.clients[2].get("two") is None  # our minority hold was given back


async def test_quorum_fence_keeps_increasing_across_a_restart(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    servers = [redis_factory() for _ in range(3)]
    lock = RedLock("quorum", [clients(server.url) for server in servers])
    assert [await lock.incr("fence") for _ in range(2)] == [1, 2]
    servers[0].stop()
    assert await lock.incr("fence") == 3
    servers[0].start()  # back empty (no persistence): its counter restarts at 0
    assert [await lock.incr("fence") for _ in range(2)] == [4, 5]
    assert await lock.clients[0].get("fence") == b"5"
