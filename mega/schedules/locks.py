"""Distributed locks over Redis: `RedLock`, what `ctx.lock(alias)` gives (a `LockAdapter`).

`RedLock` over one server is ``SET key token NX PX ttl`` plus a compare-and-delete release in
Lua: a holder whose TTL ran out must never delete the lock a peer has taken since. Over several
independent servers it is the Redlock quorum: the lock is held when a majority (N/2+1) accepted
it within its validity (ttl - elapsed - clock drift); otherwise the partial holds are released.

Read the Redlock critique (Kleppmann, "How to do distributed locking") before trusting any lock
with correctness: a paused holder can outlive its TTL. `incr()` hands out fencing numbers so the
protected writes can refuse a stale holder, and `acquire_fenced()` takes a lock together with its
fencing number (plus an optional one-shot claim): what a scheduler tick needs, in one round trip
on one server.

A claim is for an instant, and the lock server's clock decides when that instant has come: the
scripts read Redis `TIME` and refuse a claim more than `CLAIM_TOLERANCE_MS` before it, so a
caller whose clock runs ahead waits instead of acting early. Every such reply carries the
server's time, and the middle of its round trip gives this process's clock offset
(`clock_offset_ms`). This needs Redis 5 or later (or valkey), where a script may write after
reading TIME.

A Redis failure is raised as `LockBackendError` (code ``lock.backend``) naming the server; a
quorum tolerates a minority of servers down and only raises when no majority can answer.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException, RedisError

from mega.context import EarlyClaim, FencedLease, Refusal
from mega.errors import ConfigError, LockBackendError
from mega.schedules.lock_scripts import (
    ACQUIRE_FENCED_SCRIPT,
    CLAIM_SCRIPT,
    EXTEND_SCRIPT,
    RAISE_TO_SCRIPT,
    RELEASE_SCRIPT,
    claim_answer,
    fenced_reply,
    quorum_claim,
)
from mega.validation import int_problem

# What a Redis call raises when the server is away: a Cluster's client raises some that are no
# RedisError (SlotNotCoveredError while a slot has no master, during a failover).
REDIS_OUTAGES = (RedisError, RedisClusterException, OSError, TimeoutError)

if TYPE_CHECKING:
    from mega.drivers.redis.client import RedisClient

# The claim's tolerance: a claim is refused as early only when the lock server's clock is more
# than this before its instant. Clocks kept by NTP agree within a few ms: a scheduler on time is
# not sent back for that, one really ahead is.
CLAIM_TOLERANCE_MS = 5
# 128 random bits: a token no other holder can guess or collide with.
TOKEN_BYTES = 16
# Bound on one command to one server, so a blackholed server cannot stall a caller.
OP_TIMEOUT_S = 1.0
# Quorum acquire: wait at most this fraction of the TTL on each server (Redlock's advice: the
# per-server timeout must be small against the TTL), but never less than the floor.
QUORUM_TIMEOUT_FRACTION = 0.1
QUORUM_TIMEOUT_MIN_S = 0.05
# Redlock's clock-drift allowance: 1% of the TTL plus 2 ms.
DRIFT_FACTOR = 0.01
DRIFT_MIN_MS = 2.0

T = TypeVar("T")


class RedLock:
    """`LockAdapter` over one Redis (SET NX PX) or a quorum of independent ones (Redlock).

    With N servers the quorum is N // 2 + 1; fencing numbers are drawn as documented in
    `incr()`.
    """

    def __init__(self, alias: str, clients: list[RedisClient]) -> None:
        """A lock over one or more Redis servers; ConfigError when `clients` is empty.

        Args:
            alias: the lock's alias (a key of `services.locks`), named in its errors.
            clients: redis.asyncio clients, one per independent server, which the caller owns
                (and closes).
        """
        if not clients:
            raise ConfigError(f"services.locks.{alias}: a lock needs at least one Redis server")
        self.alias = alias
        self.clients = list(clients)
        self.quorum = len(clients) // 2 + 1
        self.servers = [server_name(client) for client in clients]
        self._release_scripts = [client.register_script(RELEASE_SCRIPT) for client in clients]
        self._extend_scripts = [client.register_script(EXTEND_SCRIPT) for client in clients]
        self._raise_scripts = [client.register_script(RAISE_TO_SCRIPT) for client in clients]
        self._fenced_scripts = [client.register_script(ACQUIRE_FENCED_SCRIPT) for client in clients]
        self._claim_scripts = [client.register_script(CLAIM_SCRIPT) for client in clients]
        self.clock_offset_ms: float | None = None  # see `LockAdapter.clock_offset_ms`

    @property
    def native(self) -> RedisClient:
        return self.clients[0]

    async def acquire(self, key: str, ttl_ms: int) -> str | None:
        """Try once on every server; the token when a majority accepted it within its validity.

        Args:
            key: the lock's Redis key.
            ttl_ms: how long the lock is held, in milliseconds (a positive int; ValueError
                otherwise).
        """
        _check_ttl("ttl_ms", ttl_ms)
        token = secrets.token_hex(TOKEN_BYTES)
        timeout_s = self._acquire_timeout_s(ttl_ms)
        started = time.monotonic()
        results = await self._on_each(
            lambda i: self.clients[i].set(key, token, nx=True, px=ttl_ms), timeout_s
        )
        elapsed_ms = (time.monotonic() - started) * 1000
        held = sum(1 for result in results if result is True)
        if held >= self.quorum and self._still_valid(ttl_ms, elapsed_ms):
            return token
        if held or any(isinstance(result, BaseException) for result in results):
            # A timed-out SET may still have landed: release everywhere so peers can try now.
            await self._release_quietly(key, token)
        self._raise_without_majority(results, f"acquire {key!r}")
        return None

    async def release(self, key: str, token: str) -> bool:
        """Compare-and-delete on every server; True when a majority still held our token.

        Args:
            key: the lock's Redis key.
            token: the token `acquire` (or `acquire_fenced`) returned.
        """
        results = await self._on_each(
            lambda i: self._release_scripts[i](keys=[key], args=[token]), OP_TIMEOUT_S
        )
        self._raise_without_majority(results, f"release {key!r}")
        return sum(1 for result in results if result == 1) >= self.quorum

    async def extend(self, key: str, token: str, ttl_ms: int) -> bool:
        """Hold `key` for `ttl_ms` from now, only while it still holds `token` (on a
        majority); False when it does not: the lock expired or a peer holds it now.

        Args:
            key: the lock's Redis key.
            token: the token `acquire` (or `acquire_fenced`) returned.
            ttl_ms: milliseconds, a positive int (ValueError otherwise).
        """
        _check_ttl("ttl_ms", ttl_ms)
        results = await self._on_each(
            lambda i: self._extend_scripts[i](keys=[key], args=[token, ttl_ms]), OP_TIMEOUT_S
        )
        self._raise_without_majority(results, f"extend {key!r}")
        return sum(1 for result in results if result == 1) >= self.quorum

    async def incr(self, key: str, floor: int = 0) -> int:
        """The next fencing number under `key`, at least `floor`.

        One server: INCR (raised to `floor`). A quorum: read the counter on every server, take
        the largest answer of a majority plus one (or `floor`), and raise every server to at
        least that value. Any two majorities share a server, so a number drawn later by the lock
        holder is always larger. Two callers drawing at the same moment may get the same
        number; draw it while holding the lock.

        Args:
            key: the Redis key of the counter, which has no TTL.
            floor: the least number returned: give one that grows on its own (a scheduler
                gives its tick's planned instant in epoch ms), so numbers keep rising even
                after a Redis restarted empty.
        """
        if len(self.clients) == 1:
            results = await self._on_each(lambda i: self.clients[i].incr(key), OP_TIMEOUT_S)
            self._raise_without_majority(results, f"incr {key!r}")
            drawn = int(results[0])  # type: ignore[arg-type]
            if drawn >= floor:
                return drawn
            raised = await self._on_each(
                lambda i: self._raise_scripts[i](keys=[key], args=[floor]), OP_TIMEOUT_S
            )
            self._raise_without_majority(raised, f"incr {key!r}")
            return int(raised[0])  # type: ignore[arg-type]
        current = await self._on_each(lambda i: self.clients[i].get(key), OP_TIMEOUT_S)
        self._raise_without_majority(current, f"incr {key!r}")
        wanted = max(
            floor,
            1
            + max(
                int(value) if isinstance(value, bytes | str | int) else 0
                for value in current
                if not isinstance(value, BaseException)
            ),
        )
        raised = await self._on_each(
            lambda i: self._raise_scripts[i](keys=[key], args=[wanted]), OP_TIMEOUT_S
        )
        self._raise_without_majority(raised, f"incr {key!r}")
        return wanted

    async def acquire_fenced(
        self,
        key: str,
        ttl_ms: int,
        fence_key: str,
        *,
        claim_key: str | None = None,
        claim_ttl_ms: int = 0,
        fence_floor: int = 0,
        claim_at_ms: int = 0,
    ) -> FencedLease | Refusal | EarlyClaim:
        """See `LockAdapter.acquire_fenced`. One server: one Lua script, one round trip, and the
        fence is issued atomically with the lock. A quorum: claim (a script on each server),
        `acquire` (lock), `incr` (fence) in turn, since a script runs on one server and cannot
        span independent ones; the fence is then drawn just after the lock is held.

        Args:
            key: the lock's Redis key; "overlap" when it is held already.
            ttl_ms: how long the lock is held, in milliseconds (a positive int).
            fence_key: the Redis key of the fencing counter (no TTL).
            claim_key: the key of a one-shot claim, taken first and left to expire ("claimed"
                when taken already); None takes no claim.
            claim_ttl_ms: how long the claim is kept, in milliseconds (a positive int when
                `claim_key` is given).
            fence_floor: the least fencing number returned (see `incr`).
            claim_at_ms: the instant claimed, in epoch ms: an `EarlyClaim` while the lock
                server's clock is more than `CLAIM_TOLERANCE_MS` before it; 0 never waits.
        """
        _check_ttl("ttl_ms", ttl_ms)
        if claim_key is not None:
            _check_ttl("claim_ttl_ms", claim_ttl_ms)
        if len(self.clients) > 1:
            return await self._acquire_fenced_in_steps(
                key, ttl_ms, fence_key, claim_key, claim_ttl_ms, claim_at_ms, fence_floor
            )
        token = secrets.token_hex(TOKEN_BYTES)
        keys = [key, fence_key]
        args: list[str | int] = [token, ttl_ms, fence_floor]
        if claim_key is not None:
            keys.append(claim_key)
            args.extend([claim_ttl_ms, claim_at_ms, CLAIM_TOLERANCE_MS])
        results = await self._run_timed(self._fenced_scripts, keys, args, OP_TIMEOUT_S)
        if isinstance(results[0], BaseException):
            # A timed-out script may still have run: give back what it may hold, as `acquire`.
            held = [k for k in keys if k != fence_key]
            await asyncio.gather(*(self._release_quietly(k, token) for k in held))
            self._raise_without_majority(results, f"acquire {key!r} with fence {fence_key!r}")
        return fenced_reply(results[0], token, self.alias)

    async def _acquire_fenced_in_steps(
        self,
        key: str,
        ttl_ms: int,
        fence_key: str,
        claim_key: str | None,
        claim_ttl_ms: int,
        claim_at_ms: int,
        fence_floor: int,
    ) -> FencedLease | Refusal | EarlyClaim:
        if claim_key is not None:
            refused = await self._claim_on_quorum(claim_key, claim_ttl_ms, claim_at_ms)
            if refused is not None:
                return refused
        token = await self.acquire(key, ttl_ms)
        if token is None:
            return "overlap"
        try:
            fence = await self.incr(fence_key, fence_floor)
        except BaseException:
            # No fence, no lease: free the lock now rather than block the next holder for a TTL.
            await self._release_quietly(key, token)
            raise
        return FencedLease(token, fence)

    async def _claim_on_quorum(
        self, key: str, ttl_ms: int, instant_ms: int
    ) -> Literal["claimed"] | EarlyClaim | None:
        """Take a claim on a majority within its validity, as `acquire` takes a lock, each
        server judging "early" by its own clock (`CLAIM_SCRIPT`); None when held."""
        token = secrets.token_hex(TOKEN_BYTES)
        started = time.monotonic()
        results = await self._run_timed(
            self._claim_scripts,
            [key],
            [token, ttl_ms, instant_ms, CLAIM_TOLERANCE_MS],
            self._acquire_timeout_s(ttl_ms),
        )
        elapsed_ms = (time.monotonic() - started) * 1000
        answers = [
            None if isinstance(reply, BaseException) else claim_answer(reply) for reply in results
        ]
        outcome = quorum_claim(answers, self.quorum)
        if outcome == "acquired" and self._still_valid(ttl_ms, elapsed_ms):
            return None
        if any(answer is None or answer[0] == "acquired" for answer in answers):
            await self._release_quietly(key, token)  # partial holds, and SETs that may have landed
        self._raise_without_majority(results, f"claim {key!r}")
        return "claimed" if outcome == "acquired" else outcome

    def _still_valid(self, ttl_ms: int, elapsed_ms: float) -> bool:
        """Whether a hold that took `elapsed_ms` to win is worth keeping: on one server its TTL
        is the whole story (no peers to disagree with); on a quorum, Redlock's validity."""
        if len(self.clients) == 1:
            return True
        return ttl_ms - elapsed_ms - (ttl_ms * DRIFT_FACTOR + DRIFT_MIN_MS) > 0

    def _acquire_timeout_s(self, ttl_ms: int) -> float:
        if len(self.clients) == 1:
            return OP_TIMEOUT_S
        fraction_s = ttl_ms / 1000 * QUORUM_TIMEOUT_FRACTION
        return min(OP_TIMEOUT_S, max(QUORUM_TIMEOUT_MIN_S, fraction_s))

    async def _run_timed(
        self, scripts: list[AsyncScript], keys: list[str], args: list[str | int], timeout_s: float
    ) -> list[Any]:
        """Run one script per server whose replies start ``[status, server now ms]``, and note
        `clock_offset_ms` from the middle of each round trip (the median over the servers)."""
        offsets_ms: list[float] = []

        async def timed(i: int) -> Any:
            sent = time.time()
            reply = await scripts[i](keys=keys, args=args)
            offsets_ms.append((sent + time.time()) / 2 * 1000 - int(reply[1]))
            return reply

        results = await self._on_each(timed, timeout_s)
        if offsets_ms:
            self.clock_offset_ms = statistics.median(offsets_ms)
        return results

    async def _on_each(
        self, op: Callable[[int], Awaitable[T]], timeout_s: float
    ) -> list[T | BaseException]:
        """Run `op(i)` on every server at once; a failure is returned in place, not raised."""

        async def one(i: int) -> T | BaseException:
            try:
                async with asyncio.timeout(timeout_s):
                    return await op(i)
            except REDIS_OUTAGES as exc:
                return exc

        if len(self.clients) == 1:
            return [await one(0)]
        return list(await asyncio.gather(*(one(i) for i in range(len(self.clients)))))

    async def _release_quietly(self, key: str, token: str) -> None:
        await self._on_each(
            lambda i: self._release_scripts[i](keys=[key], args=[token]), OP_TIMEOUT_S
        )

    def _raise_without_majority(self, results: list[Any], action: str) -> None:
        failures = [
            f"{server}: {_describe(result)}"
            for server, result in zip(self.servers, results, strict=True)
            if isinstance(result, BaseException)
        ]
        if len(results) - len(failures) >= self.quorum:
            return
        if len(self.clients) == 1:
            message = f"lock {self.alias!r}: {action} failed on Redis at {failures[0]}"
        else:
            message = (
                f"lock {self.alias!r}: {action}: only {len(results) - len(failures)} of "
                f"{len(results)} Redis servers answered (quorum {self.quorum}); "
                + "; ".join(failures)
            )
        raise LockBackendError(message)


def server_name(client: RedisClient) -> str:
    """`host:port/db` (or the socket path) of a client, for messages and audits; a Redis
    Cluster's: `cluster:` and the nodes it was given."""
    if isinstance(client, RedisCluster):
        return "cluster:" + ",".join(f"{node.host}:{node.port}" for node in client.startup_nodes)
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


def _check_ttl(name: str, ttl_ms: object) -> None:
    problem = int_problem(ttl_ms, unit="milliseconds")
    if problem:
        raise ValueError(f"{name} {problem}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
