"""A locked schedule's claim of each tick and its overlap guard (see mega/schedules/scheduler.py
for why both): `acquire` takes claim, guard and fence in one call, waiting out a lock server
whose clock is behind; `keep_guard` renews the guard while its run lives, `release_guard` lets
it go and says whether it had expired."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from mega.context import EarlyClaim, FencedLease, LockAdapter, Refusal
from mega.errors import MegaError
from mega.schedules.dynamic import entry_prefix
from mega.schedules.schedule import LockPlan, ScheduleSpec, TickSource

logger = logging.getLogger("mega.scheduler")

# The claim must outlive the clock skew between peers (up to a second), or a late peer could
# claim an instant again after the first claim expired; so never shorter than this.
CLAIM_MIN_TTL_MS = 60_000
# A claim found early waits for the lock server's clock and is tried again, up to this long in
# all: an instance further ahead than this has a broken clock, not a skewed one, and skips the
# tick (its peers run it) rather than pile up waiting ticks.
EARLY_WAIT_LIMIT_S = 60.0
# The overlap guard is renewed this many times per TTL while its run lives: one renewal may
# fail (a Redis blip) and the next still lands before the guard expires.
GUARD_RENEWALS_PER_TTL = 3
# The skip reason for each refusal of `acquire_fenced` (signals, audit, status pages). Each
# instance records its own: on a tick inside a long run, the one that claimed it met the guard
# ("overlap") and the others met its claim ("claimed"), since the claim is taken first and kept.
REFUSAL_REASONS: dict[Refusal, str] = {
    "claimed": "claimed by another instance",
    "overlap": "overlap: the previous run still runs",
}


class GuardExpired(MegaError):
    """A run outlived its overlap guard's TTL (reported as a `fail` signal, phase "release")."""

    code = "schedule.guard_expired"


async def acquire(
    spec: ScheduleSpec,
    adapter: LockAdapter,
    planned: datetime,
    source: TickSource,
    note_clock: Callable[[float | None], Awaitable[None]],
) -> FencedLease | Refusal | EarlyClaim:
    """Claim, guard and fence in one call; while the lock server finds the claim early,
    wait for its clock to reach the instant (by its answer) and claim again, up to
    EARLY_WAIT_LIMIT_S; `note_clock` hears the offset each answer measured. A manual tick
    is its own instant: no claim, only guard and fence. An entry's claims and guard are its
    own; the fence counter is the class's."""
    assert spec.lock is not None
    plan = spec.lock
    claim_key = None
    if source == "schedule":
        claim_key = f"{own_prefix(spec)}:tick:{int(planned.timestamp())}"
    instant_ms = int(planned.timestamp() * 1000)
    waited_s = 0.0
    while True:
        lease = await adapter.acquire_fenced(
            guard_key(spec),
            plan.ttl_ms,
            f"{plan.key_prefix}:fence",
            claim_key=claim_key,
            claim_ttl_ms=max(plan.ttl_ms, CLAIM_MIN_TTL_MS),
            claim_at_ms=instant_ms,
            # The planned instant (ms) keeps fences rising after a Redis restarted empty.
            fence_floor=instant_ms,
        )
        await note_clock(adapter.clock_offset_ms)
        if not isinstance(lease, EarlyClaim):
            return lease
        waited_s += lease.wait_ms / 1000
        if waited_s > EARLY_WAIT_LIMIT_S:
            return lease
        await asyncio.sleep(lease.wait_ms / 1000)


def own_prefix(spec: ScheduleSpec) -> str:
    """The prefix of the claims and guard of what `spec` ticks: the class, or one entry of it."""
    assert spec.lock is not None
    if spec.key is None:
        return spec.lock.key_prefix
    return entry_prefix(spec.lock, spec.key)


def guard_key(spec: ScheduleSpec) -> str:
    return f"{own_prefix(spec)}:running"


async def release_guard(
    plan: LockPlan, key: str, adapter: LockAdapter, token: str
) -> Exception | None:
    """Release the overlap guard `key`; the error to report, if any (never raises)."""
    try:
        if await adapter.release(key, token):
            return None
    except Exception as exc:
        return exc
    return GuardExpired(
        f"the overlap guard expired before the run ended: it is renewed every "
        f"{plan.ttl_ms // GUARD_RENEWALS_PER_TTL} ms (lock.ttl is {plan.ttl_ms} ms), so the "
        "renewals failed (Redis unreachable, or the event loop blocked longer than the ttl) and "
        "a peer could have started the next tick"
    )


async def keep_guard(plan: LockPlan, key: str, adapter: LockAdapter, token: str) -> None:
    """Renew the overlap guard `key` while its run lives (cancelled when the run ends). Stops
    once the guard is lost: the release then reports it (`GuardExpired`)."""
    while True:
        await asyncio.sleep(plan.ttl_ms / GUARD_RENEWALS_PER_TTL / 1000)
        try:
            if not await adapter.extend(key, token, plan.ttl_ms):
                logger.warning("overlap guard %r lost during the run; not renewed", key)
                return
        except Exception as exc:  # a Redis blip: the next renewal may still land in time
            logger.warning("overlap guard %r not renewed (%s); retrying", key, exc)
