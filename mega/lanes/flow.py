"""Flow control in a consume loop: of the deliveries fetched, which start now and which wait.

    class SyncMailbox(Job):
        subject = "mail.sync"
        bus = "jobs"
        rate_limit = {"limit": 5, "period_s": 1, "per": "key"}   # 5 starts a second per tenant
        key_concurrency = 2                                       # 2 runs at once per tenant

    await SyncMailbox.enqueue(ctx, {"mailbox": 7}, key="tenant-42")

A Job may declare two limits, both counted in a cache (Redis) that every worker of the job
shares (`flow_cache`, or the config's only cache):
- `rate_limit`: starts in any `period_s`, for the whole group or, with "per": "key", for each
  key (mega/lanes/ratelimit.py);
- `key_concurrency`: runs of one key at once, across the whole group. Each run holds a lease in
  a sorted set per key, scored by when it lapses (Redis's clock): it lasts the job's ack wait,
  is renewed with the run's heartbeat and dropped when the run ends, so a crashed worker's
  leases lapse when its jobs are delivered again.

Jobs enqueued without a key count as one key of their own. A delivery starts once every limit
grants it; one refused goes back to the queue as a delayed message with its attempt unchanged
(no attempt spent, no slot held), due when it could start: when the rate window frees a start,
or, refused a key's slot, after about one run of the job (the mean of this loop's latest runs)
for each `key_concurrency` of the key's jobs refused before it. A grant of one limit that the
other refused is given back. When the cache does not answer nothing starts: a limit protects
someone else's service, so it fails closed.

A key far over its share is moved through the queue this way rather than skipped in place: the
engines keep one queue per job, in order, so its held jobs are put back behind the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mega.context import Context
from mega.drivers.base import Delivery
from mega.lanes.ratelimit import Grant, RateLimit, RateLimiter, flow_cache

logger = logging.getLogger("mega.jobqueue")

# A run's length before any was measured, and the bounds of the estimate: how long a job
# refused a key's slot waits, for each `key_concurrency` of the key's jobs refused before it.
FIRST_RUN_S = 1.0
MIN_RUN_S = 0.05
MAX_RUN_S = 30.0
# Weight of the latest run in the mean of runs (an exponential moving average).
RUN_WEIGHT = 0.2

# KEYS[1]: the key's leases (member -> lapses at, in Redis's ms; the set itself is kept a second
# past its last lease); ARGV: the cap, the lease in ms, then one new member per run wanted.
# Returns the members granted (the first ones).
TAKE_SLOTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = math.min(cap - redis.call('ZCARD', KEYS[1]), #ARGV - 2)
local granted = {}
for i = 1, n do
  redis.call('ZADD', KEYS[1], now + lease, ARGV[i + 2])
  granted[i] = ARGV[i + 2]
end
if n > 0 then redis.call('PEXPIRE', KEYS[1], lease + 1000) end
return granted
"""

# KEYS[1]: the key's leases; ARGV: the lease in ms, then the members to renew (XX: a lease that
# lapsed is not brought back).
RENEW_SLOTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], lease + 1000)
return 1
"""


class Limited(Protocol):
    """What the limits of a lane are made from (a JobSpec, a ListenerSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def rate_limit(self) -> RateLimit | None: ...
    @property
    def key_concurrency(self) -> int | None: ...
    @property
    def flow_cache(self) -> str | None: ...
    @property
    def ack_wait_s(self) -> float: ...


def gate_of(ctx: Context, spec: Limited, lane_key: str) -> Gate | None:
    """The limits of the lane `lane_key` names (None when it has none), on their cache;
    ConfigError naming the fix when there is no such cache."""
    rate, cap = spec.rate_limit, spec.key_concurrency
    if rate is None and cap is None:
        return None
    redis = flow_cache(ctx, spec.name, spec.flow_cache)
    return Gate(
        # The log and its counter (`:n`, which TAKE derives) in one hash slot: a Redis
        # Cluster runs a script only on keys of one slot.
        RateLimiter(redis, f"mega:rate:{{{lane_key}}}", rate) if rate is not None else None,
        KeySlots(redis, f"mega:slots:{lane_key}", cap, spec.ack_wait_s) if cap else None,
    )


@dataclass
class Slot:
    """The lease a run holds of its key, and when the run began (monotonic s)."""

    flow_key: str
    member: str
    began: float = field(default_factory=time.monotonic)


class KeySlots:
    """`key_concurrency` of one lane, in one process (see the module's docstring)."""

    def __init__(self, redis: Any, key: str, cap: int, lease_s: float) -> None:
        self.key = key
        self.cap = cap
        self.lease_ms = max(1, round(lease_s * 1000))
        self.redis = redis
        self.run_s = FIRST_RUN_S
        self.held: dict[Hashable, Slot] = {}  # Delivery.key -> its lease
        # Leases of runs that ended, by key, dropped together by one task at a time: one round
        # trip for many runs, and never a connection per run.
        self.dropping: dict[str, list[str]] = {}
        self.dropper: asyncio.Task[None] | None = None
        self._take = redis.register_script(TAKE_SLOTS)
        self._renew = redis.register_script(RENEW_SLOTS)

    def leases_of(self, flow_key: str | None) -> str:
        return f"{self.key}:{flow_key or ''}"

    async def take(self, flow_key: str | None, deliveries: Sequence[Delivery]) -> int:
        """A lease for as many of `deliveries` (all of `flow_key`) as the cap leaves room for,
        the first ones; how many. A cache that does not answer grants none (logged)."""
        members = [uuid.uuid4().hex for _ in deliveries]
        try:
            granted = await self._take(
                keys=[self.leases_of(flow_key)], args=[self.cap, self.lease_ms, *members]
            )
        except Exception as exc:  # the cache is down or refuses: start nothing for now
            logger.warning(
                "%s: its key_concurrency cannot be read (%s): nothing starts", self.key, exc
            )
            return 0
        for delivery, member in zip(deliveries, members[: len(granted)], strict=False):
            self.held[delivery.key] = Slot(flow_key or "", member)
        return len(granted)

    def ended(self, delivery: Delivery) -> None:
        """The run of `delivery` is over: its lease goes (soon, with others), and its length
        joins the mean."""
        slot = self.held.pop(delivery.key, None)
        if slot is None:
            return
        took = time.monotonic() - slot.began
        self.run_s = min(MAX_RUN_S, max(MIN_RUN_S, self.run_s + RUN_WEIGHT * (took - self.run_s)))
        self.dropping.setdefault(slot.flow_key, []).append(slot.member)
        if self.dropper is None or self.dropper.done():
            self.dropper = asyncio.create_task(self._drop())

    async def close(self) -> None:
        """Drop the leases of the runs that ended before this returns."""
        if self.dropper is not None:
            await self.dropper

    async def renew(self, deliveries: Sequence[Delivery]) -> None:
        """Push back the lapse of these runs' leases (with their heartbeat)."""
        by_key: dict[str, list[str]] = {}
        for delivery in deliveries:
            slot = self.held.get(delivery.key)
            if slot is not None:
                by_key.setdefault(slot.flow_key, []).append(slot.member)
        for flow_key, members in by_key.items():
            try:
                await self._renew(keys=[self.leases_of(flow_key)], args=[self.lease_ms, *members])
            except Exception as exc:  # renewed at the next heartbeat, or lapsing meanwhile
                logger.warning("%s: leases of key %r not renewed (%s)", self.key, flow_key, exc)

    def due_s(self, place: int) -> float:
        """When the `place`-th of a key's jobs refused now may find a slot free."""
        return self.run_s * (1 + place // self.cap)

    async def _drop(self) -> None:
        """Drop every lease waiting to go, in one pipeline, until none is left."""
        while self.dropping:
            batch, self.dropping = self.dropping, {}
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for flow_key, members in batch.items():
                        pipe.zrem(self.leases_of(flow_key), *members)
                    await pipe.execute()
            except Exception as exc:  # the leases lapse with their ack wait: nothing is lost
                logger.warning(
                    "%s: %d lease(s) not dropped (%s)", self.key, sum(map(len, batch.values())), exc
                )


@dataclass
class Admission:
    """What `Gate.admit` decided: the deliveries to `start` (in the order fetched), the `held`
    ones with how long each waits (s), and how long the loop waits before it fetches again."""

    start: list[Delivery]
    held: list[tuple[Delivery, float]]
    wait_s: float
    # The rate limit's grants: (key, grant, the deliveries granted, in the grant's order).
    grants: list[tuple[str | None, Grant, list[Delivery]]] = field(default_factory=list)


class Gate:
    """The limits of one lane in one process, applied to each batch fetched."""

    def __init__(self, rate: RateLimiter | None, slots: KeySlots | None) -> None:
        self.rate = rate
        self.slots = slots

    @property
    def fetch_cap(self) -> int | None:
        """At most this many deliveries are worth fetching at once (a limit of the whole group's
        starts), or None."""
        if self.rate is None or self.rate.per_key:
            return None
        return self.rate.limit.limit

    async def admit(self, runs: list[Delivery]) -> Admission:
        """Ask each limit in turn for the deliveries the one before granted."""
        admission = Admission([], [], 0.0)
        granted = runs
        if self.rate is not None:
            granted = await self._rated(granted, admission)
        if self.slots is not None:
            granted = await self._slotted(granted, admission)
        chosen = {id(delivery) for delivery in granted}
        admission.start = [delivery for delivery in runs if id(delivery) in chosen]
        return admission

    async def _rated(self, runs: list[Delivery], admission: Admission) -> list[Delivery]:
        rate = self.rate
        assert rate is not None
        groups: dict[str | None, list[Delivery]] = {None: runs}
        if rate.per_key:
            groups = _by_key(runs)
        grants = await asyncio.gather(
            *(rate.take(len(group), flow_key) for flow_key, group in groups.items())
        )
        granted: list[Delivery] = []
        for (flow_key, group), grant in zip(groups.items(), grants, strict=True):
            n = len(grant.members)
            granted += group[:n]
            admission.grants.append((flow_key, grant, group[:n]))
            admission.held += [
                (delivery, rate.due_s(place, grant.wait_s))
                for place, delivery in enumerate(group[n:])
            ]
            if n < len(group) and not rate.per_key:  # the whole group waits for the window
                admission.wait_s = grant.wait_s
        return granted

    async def _slotted(self, runs: list[Delivery], admission: Admission) -> list[Delivery]:
        slots = self.slots
        assert slots is not None
        groups = _by_key(runs)
        counts = await asyncio.gather(
            *(slots.take(flow_key, group) for flow_key, group in groups.items())
        )
        granted: list[Delivery] = []
        for group, n in zip(groups.values(), counts, strict=True):
            granted += group[:n]
            admission.held += [
                (delivery, slots.due_s(place)) for place, delivery in enumerate(group[n:])
            ]
        return granted

    async def started(self, admission: Admission) -> None:
        """The admitted runs began: stamp their rate grants, give back the grants of those
        another limit refused."""
        if self.rate is None:
            return
        began = {id(delivery) for delivery in admission.start}
        for flow_key, grant, granted in admission.grants:
            if not grant.members:
                continue
            ran = [m for m, d in zip(grant.members, granted, strict=False) if id(d) in began]
            back = [m for m, d in zip(grant.members, granted, strict=False) if id(d) not in began]
            await self.rate.settle(Grant([*ran, *back], grant.wait_s), len(ran), flow_key)

    def ended(self, delivery: Delivery) -> None:
        if self.slots is not None:
            self.slots.ended(delivery)

    async def close(self) -> None:
        if self.slots is not None:
            await self.slots.close()

    async def renew(self, deliveries: Sequence[Delivery]) -> None:
        if self.slots is not None and deliveries:
            await self.slots.renew(deliveries)


def _by_key(deliveries: list[Delivery]) -> dict[str | None, list[Delivery]]:
    """The deliveries by key, those without one under "" (one key of their own)."""
    groups: dict[str | None, list[Delivery]] = {}
    for delivery in deliveries:
        groups.setdefault(delivery.flow_key or "", []).append(delivery)
    return groups
