"""mega.schedules.locks against real Redis servers (the session one, and private ones to stop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from mega.context import EarlyClaim, FencedLease, Refusal
from mega.drivers.embedded import EmbeddedServer
from mega.drivers.redis.client import RedisClient
from mega.errors import LockBackendError
from mega.schedules.lock_scripts import quorum_claim
from mega.schedules.locks import CLAIM_TOLERANCE_MS, RedLock


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


async def test_extend_renews_only_the_holders_lock(lock: RedLock, prefix: str) -> None:
    token = await lock.acquire(f"{prefix}:a", 200)
    assert token is not None
    assert await lock.extend(f"{prefix}:a", token, 5_000) is True
    assert 4_000 < await lock.native.pttl(f"{prefix}:a") <= 5_000
    assert await lock.extend(f"{prefix}:a", "not-our-token", 60_000) is False
    assert await lock.native.pttl(f"{prefix}:a") <= 5_000  # a foreign token renews nothing
    assert await lock.release(f"{prefix}:a", token) is True
    assert await lock.extend(f"{prefix}:a", token, 5_000) is False  # gone: not recreated
    assert await lock.native.exists(f"{prefix}:a") == 0


async def test_quorum_extend_needs_a_majority(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    servers = [redis_factory() for _ in range(3)]
    lock = RedLock("quorum", [clients(server.url) for server in servers])
    token = await lock.acquire("q", 5_000)
    assert token is not None
    await lock.clients[0].delete("q")
    assert await lock.extend("q", token, 5_000) is True  # two of three still hold it
    await lock.clients[1].delete("q")
    assert await lock.extend("q", token, 5_000) is False
    servers[2].stop()
    servers[1].stop()
    with pytest.raises(LockBackendError, match="extend 'q'"):
        await lock.extend("q", token, 5_000)


async def test_incr_counts_up(lock: RedLock, prefix: str) -> None:
    assert [await lock.incr(f"{prefix}:fence") for _ in range(3)] == [1, 2, 3]


async def test_a_fence_floor_lifts_the_counter_and_never_lowers_it(
    lock: RedLock, prefix: str
) -> None:
    key = f"{prefix}:fence"
    assert await lock.incr(key, floor=1_000) == 1_000
    assert await lock.incr(key) == 1_001
    assert await lock.incr(key, floor=50) == 1_002  # a floor below the counter changes nothing
    lease = await lock.acquire_fenced(f"{prefix}:g", 5_000, key, fence_floor=1_764_547_200_000)
    assert isinstance(lease, FencedLease) and lease.fence == 1_764_547_200_000
    await lock.release(f"{prefix}:g", lease.token)
    again = await lock.acquire_fenced(f"{prefix}:g", 5_000, key, fence_floor=10)
    assert isinstance(again, FencedLease) and again.fence == 1_764_547_200_001


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
    assert await lock.incr("fence", floor=100) == 100  # a quorum honours the floor too
    assert await lock.incr("fence") == 101


# -- acquire_fenced: claim, guard and fence in one step ------------------------------------


async def fenced(
    lock: RedLock, prefix: str, claim: str | None = None, ttl_ms: int = 5_000, at_ms: int = 0
) -> FencedLease | Refusal | EarlyClaim:
    """`acquire_fenced` with the scheduler's key layout under `prefix`, claiming `at_ms`."""
    claim_key = None if claim is None else f"{prefix}:tick:{claim}"
    return await lock.acquire_fenced(
        f"{prefix}:running",
        ttl_ms,
        f"{prefix}:fence",
        claim_key=claim_key,
        claim_ttl_ms=60_000,
        claim_at_ms=at_ms,
    )


async def server_ms(client: RedisClient) -> int:
    seconds, microseconds = await client.time()
    return int(seconds * 1000 + microseconds // 1000)


async def test_acquire_fenced_claimed_overlap_acquired(lock: RedLock, prefix: str) -> None:
    first = await fenced(lock, prefix, claim="1")
    assert isinstance(first, FencedLease) and first.fence == 1 and len(first.token) == 32
    assert await lock.native.get(f"{prefix}:running") == first.token.encode()
    assert 0 < await lock.native.pttl(f"{prefix}:running") <= 5_000
    assert 55_000 < await lock.native.pttl(f"{prefix}:tick:1") <= 60_000

    assert await fenced(lock, prefix, claim="1") == "claimed"  # same instant: already taken
    assert await fenced(lock, prefix, claim="2") == "overlap"  # next instant: guard still held
    assert await lock.native.exists(f"{prefix}:tick:2") == 1  # ... and that tick is consumed
    assert await fenced(lock, prefix, claim="2") == "claimed"
    assert await fenced(lock, prefix) == "overlap"  # no claim (a manual tick): guard only
    assert await lock.native.get(f"{prefix}:fence") == b"1"  # refusals draw no fence

    assert await lock.release(f"{prefix}:running", first.token) is True
    second = await fenced(lock, prefix, claim="3")
    assert isinstance(second, FencedLease) and second.fence == 2 and second.token != first.token


async def test_acquire_fenced_fences_strictly_increase(lock: RedLock, prefix: str) -> None:
    fences = []
    for n in range(5):
        lease = await fenced(lock, prefix, claim=None if n % 2 else str(n))
        assert isinstance(lease, FencedLease)
        fences.append(lease.fence)
        assert await lock.release(f"{prefix}:running", lease.token) is True
    assert fences == [1, 2, 3, 4, 5]
    lease = await fenced(lock, prefix, ttl_ms=100)  # an expired guard frees the next holder
    assert isinstance(lease, FencedLease)
    await asyncio.sleep(0.25)
    later = await fenced(lock, prefix)
    assert isinstance(later, FencedLease) and later.fence == 7
    assert await lock.release(f"{prefix}:running", lease.token) is False  # the stale holder


async def test_acquire_fenced_is_one_cached_script_call(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    lock = RedLock("main", [clients(redis_factory().url)])
    assert isinstance(await fenced(lock, "p", claim="1"), FencedLease)  # loads the script
    await lock.native.config_resetstat()
    assert await fenced(lock, "p", claim="2") == "overlap"
    assert await fenced(lock, "p", claim="3") == "overlap"
    await lock.native.script_flush()  # a restarted server forgets scripts: loaded again
    assert await fenced(lock, "p", claim="4") == "overlap"
    stats = await lock.native.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()}
    assert calls["evalsha"] == 4  # one per call, plus the retry after the flush
    assert calls["script|load"] == 1
    assert "eval" not in calls


async def test_acquire_fenced_with_decoded_responses(redis_url: str, prefix: str) -> None:
    lock = RedLock("main", [Redis.from_url(redis_url, decode_responses=True)])
    try:
        lease = await fenced(lock, prefix, claim="1")
        assert isinstance(lease, FencedLease) and lease.fence == 1
        assert await fenced(lock, prefix, claim="1") == "claimed"
    finally:
        await lock.native.aclose()


async def test_acquire_fenced_leaves_no_guard_when_the_fence_fails(
    lock: RedLock, prefix: str
) -> None:
    await lock.native.rpush(f"{prefix}:fence", "not a counter")
    with pytest.raises(LockBackendError, match="WRONGTYPE"):
        await fenced(lock, prefix, claim="1")
    assert await lock.native.exists(f"{prefix}:running") == 0  # the next tick is not blocked


@pytest.mark.parametrize("ttl_ms", [0, -1, True, 1.5, "1000"])
async def test_acquire_fenced_ttls_must_be_positive_ints(
    lock: RedLock, prefix: str, ttl_ms: object
) -> None:
    with pytest.raises(ValueError, match="ttl_ms"):
        await lock.acquire_fenced(f"{prefix}:g", ttl_ms, f"{prefix}:f")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="claim_ttl_ms"):
        await lock.acquire_fenced(
            f"{prefix}:g",
            1_000,
            f"{prefix}:f",
            claim_key=f"{prefix}:c",
            claim_ttl_ms=ttl_ms,  # type: ignore[arg-type]
        )


async def test_acquire_fenced_backend_down_raises_lock_backend_error(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    server = redis_factory()
    lock = RedLock("main", [clients(server.url)])
    assert isinstance(await fenced(lock, "p", claim="1"), FencedLease)
    server.stop()
    with pytest.raises(LockBackendError) as caught:
        await fenced(lock, "p", claim="2")
    assert caught.value.code == "lock.backend"
    assert f"127.0.0.1:{server.port}" in caught.value.message
    assert "lock 'main'" in caught.value.message
    server.start()  # back, empty: the call works again (the script is loaded anew)
    lease = await fenced(lock, "p", claim="2")
    assert isinstance(lease, FencedLease) and lease.fence == 1


async def test_quorum_acquire_fenced_with_one_of_three_servers_stopped(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    servers = [redis_factory() for _ in range(3)]
    lock = RedLock("quorum", [clients(server.url) for server in servers])
    first = await fenced(lock, "p", claim="1")
    assert isinstance(first, FencedLease) and first.fence == 1
    assert [await client.get("p:running") for client in lock.clients] == [first.token.encode()] * 3
    assert await lock.release("p:running", first.token) is True

    servers[0].stop()
    second = await fenced(lock, "p", claim="2")
    assert isinstance(second, FencedLease) and second.fence == 2
    assert await fenced(lock, "p", claim="2") == "claimed"
    assert await fenced(lock, "p", claim="3") == "overlap"
    assert await fenced(lock, "p", claim="3") == "claimed"  # the overlapped tick is consumed
    assert await lock.release("p:running", second.token) is True
    third = await fenced(lock, "p")
    assert isinstance(third, FencedLease) and third.fence == 3

    servers[1].stop()  # a majority down: an error, never a lease
    with pytest.raises(LockBackendError, match="only 1 of 3"):
        await fenced(lock, "p", claim="4")


async def test_quorum_acquire_fenced_frees_the_guard_when_the_fence_fails(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    lock = RedLock("quorum", [clients(redis_factory().url) for _ in range(3)])
    for client in lock.clients:
        await client.rpush("p:fence", "not a counter")
    with pytest.raises(LockBackendError, match="incr 'p:fence'"):
        await fenced(lock, "p", claim="1")
    assert [await client.exists("p:running") for client in lock.clients] == [0, 0, 0]


# -- the claim's instant, by the lock server's clock -----------------------------------------


async def test_a_claim_before_its_instant_on_the_servers_clock_is_early_and_takes_nothing(
    lock: RedLock, prefix: str
) -> None:
    assert lock.clock_offset_ms is None  # nothing measured yet
    now_ms = await server_ms(lock.native)
    began = time.monotonic()
    early = await fenced(lock, prefix, claim="1", at_ms=now_ms + 2_000)
    claim_ms = (time.monotonic() - began) * 1000
    assert isinstance(early, EarlyClaim) and 1_900 < early.wait_ms <= 2_000
    assert await lock.native.exists(f"{prefix}:tick:1", f"{prefix}:running", f"{prefix}:fence") == 0
    # This process and the server share the machine's clock: the measured offset is 0 give or
    # take half the claim's round trip and the server's whole milliseconds.
    assert lock.clock_offset_ms is not None and abs(lock.clock_offset_ms) <= claim_ms / 2 + 1

    # Within the tolerance of the instant: taken (the server's clock only moves towards it).
    now_ms = await server_ms(lock.native)
    near = await fenced(lock, prefix, claim="1", at_ms=now_ms + CLAIM_TOLERANCE_MS - 1)
    assert isinstance(near, FencedLease)
    assert await lock.release(f"{prefix}:running", near.token) is True
    late = await fenced(lock, prefix, claim="2", at_ms=now_ms - 1_500)  # a slow clock's claim
    assert isinstance(late, FencedLease) and late.fence == near.fence + 1
    manual = await fenced(lock, prefix, at_ms=now_ms + 60_000)  # no claim: no instant to wait for
    assert manual == "overlap"


async def test_a_quorum_claim_before_its_instant_is_early_on_the_servers_clocks(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis]
) -> None:
    servers = [redis_factory() for _ in range(3)]
    lock = RedLock("quorum", [clients(server.url) for server in servers])
    began = time.monotonic()
    now_ms = await server_ms(lock.native)
    early = await fenced(lock, "p", claim="1", at_ms=now_ms + 2_000)
    # The wait is 2 s less what passed between reading the server's clock and the claim (a
    # busy machine can take a few hundred ms there), measured here around both.
    passed_ms = (time.monotonic() - began) * 1000
    assert isinstance(early, EarlyClaim) and 2_000 - passed_ms - 5 <= early.wait_ms <= 2_000
    assert [await client.exists("p:tick:1", "p:running") for client in lock.clients] == [0, 0, 0]
    # One machine's clock: the offset is 0 give or take half a claim's round trip (the middle
    # of it is taken as the server's instant) and the server's whole milliseconds. A busy
    # machine's round trip is long (a CI run read -96 ms): bounded by what passed here.
    assert lock.clock_offset_ms is not None
    assert abs(lock.clock_offset_ms) <= passed_ms / 2 + 1

    servers[2].stop()  # a minority down: the majority's clocks still decide
    lease = await fenced(lock, "p", claim="1", at_ms=now_ms)
    assert isinstance(lease, FencedLease)
    assert await fenced(lock, "p", claim="1", at_ms=now_ms) == "claimed"


# One server's answer to a claim, as `quorum_claim` reads it.
HELD, TAKEN = ("acquired", 0), ("claimed", 0)


def early(wait_ms: int) -> tuple[str, int]:
    return ("early", wait_ms)


@pytest.mark.parametrize(
    ("answers", "outcome"),
    [
        ([HELD], "acquired"),
        ([early(7)], EarlyClaim(7)),
        ([TAKEN], "claimed"),
        ([HELD, HELD, TAKEN], "acquired"),
        ([HELD, HELD, early(400)], "acquired"),
        ([early(400), early(500), early(300)], EarlyClaim(400)),  # two at the instant: enough
        ([HELD, early(300), TAKEN], EarlyClaim(300)),  # the early one can complete a majority
        ([HELD, early(300), None], EarlyClaim(300)),  # ... with a server down too
        ([early(300), TAKEN, TAKEN], "claimed"),  # a peer holds a majority: waiting cannot help
        ([HELD, TAKEN, None], "claimed"),
        ([HELD, early(100), early(900), early(50), TAKEN], EarlyClaim(100)),  # 2 more of 5
    ],
)
def test_quorum_claim_outcome(
    answers: list[tuple[str, int] | None], outcome: str | EarlyClaim
) -> None:
    assert quorum_claim(answers, len(answers) // 2 + 1) == outcome
