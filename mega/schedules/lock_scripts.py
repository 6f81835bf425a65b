"""The Lua scripts `RedLock` runs on each Redis server (`mega.schedules.locks`).

A script runs atomically on one server: what must not interleave with a peer's commands (check a
token, then delete; take a claim, then a guard, then a fence) is one script. redis-py's
`register_script` sends each by its SHA1 (EVALSHA) and loads it again after a server restart.
Below them, how their replies read: a fenced lease's, and one claim's answers from a quorum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from mega.context import EarlyClaim, FencedLease, Refusal
from mega.errors import LockBackendError

# Delete the key only while it still holds our token.
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
# Reset the key's TTL only while it still holds our token: a lease renewed by its holder alone.
EXTEND_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# Raise a counter to at least ARGV[1] (never lower it): the quorum form of INCR, see `incr()`.
RAISE_TO_SCRIPT = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
    redis.call('SET', KEYS[1], wanted)
    return wanted
end
return current
"""
# What the claiming scripts begin with: `now`, the server's clock in epoch ms, and
# `refuse_claim`, which takes a tick's claim (SET NX PX) and answers nil, or else why not:
# {'early', now, ms until the instant} while the server's clock is more than the tolerance
# before the claim's instant (nothing taken), or {'claimed', now} when a peer holds it.
# A script may read TIME and then write since Redis 5: it replicates its effects, not itself.
CLAIM_LUA = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function refuse_claim(key, token, ttl_ms, instant_ms, tolerance_ms)
    local early_ms = tonumber(instant_ms) - now
    if early_ms > tonumber(tolerance_ms) then
        return {'early', now, early_ms}
    end
    if not redis.call('SET', key, token, 'NX', 'PX', ttl_ms) then
        return {'claimed', now}
    end
    return nil
end
"""
# `acquire_fenced` on one server, atomically: KEYS = guard, fence[, claim]; ARGV = token, guard
# ttl ms, fence floor[, claim ttl ms, claim instant ms, tolerance ms]. Replies are {status, server
# now ms[, fence]}. The claim is taken first and kept even on "overlap" (tick consumed). The
# fence is the counter plus one, or the floor when that is larger: a counter lost with a Redis
# restarted empty starts again above every fence drawn before.
# INCR comes before the guard's SET: a script that fails half-way keeps its earlier writes, and a
# fence key holding a non-number must not leave a guard behind that blocks the next ticks.
ACQUIRE_FENCED_SCRIPT = (
    CLAIM_LUA
    + """
if #KEYS == 3 then
    local refused = refuse_claim(KEYS[3], ARGV[1], ARGV[4], ARGV[5], ARGV[6])
    if refused then
        return refused
    end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
    return {'overlap', now}
end
local fence = redis.call('INCR', KEYS[2])
if fence < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[2], ARGV[3])
    fence = ARGV[3]
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {'acquired', now, fence}
"""
)
# One server's share of a quorum's claim: KEYS = claim; ARGV = token, ttl ms, instant ms,
# tolerance ms. Replies {'acquired', now}, or `refuse_claim`'s refusal.
CLAIM_SCRIPT = (
    CLAIM_LUA
    + """
return refuse_claim(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) or {'acquired', now}
"""
)


# -- the replies ------------------------------------------------------------------------------


def fenced_reply(reply: Any, token: str, alias: str) -> FencedLease | Refusal | EarlyClaim:
    """Read `ACQUIRE_FENCED_SCRIPT`'s reply: ``[status, now]`` or ``[status, now, detail]``,
    the detail being the fence ("acquired") or the wait ("early")."""
    status = reply_text(reply[0])
    if status == "acquired":
        return FencedLease(token, int(reply[2]))
    if status == "early":
        return EarlyClaim(int(reply[2]))
    if status == "claimed":
        return "claimed"
    if status == "overlap":
        return "overlap"
    raise LockBackendError(f"lock {alias!r}: unexpected script reply {reply!r}")


def quorum_claim(
    answers: Sequence[tuple[str, int] | None], quorum: int
) -> Literal["acquired", "claimed"] | EarlyClaim:
    """What the servers' answers to one claim add up to. Each answer is ``("acquired", 0)``,
    ``("claimed", 0)``, ``("early", ms until the instant on that server)`` or None (no answer).

    "acquired" when a majority took it. Else, when servers that found it early could still make
    a majority with those that took it, an `EarlyClaim` to wait until just enough of them reach
    the instant; else "claimed": a peer holds too many servers for waiting to help.
    """
    held = sum(1 for answer in answers if answer and answer[0] == "acquired")
    if held >= quorum:
        return "acquired"
    waits_ms = sorted(answer[1] for answer in answers if answer and answer[0] == "early")
    missing = quorum - held
    if len(waits_ms) >= missing:
        return EarlyClaim(waits_ms[missing - 1])
    return "claimed"


def claim_answer(reply: Any) -> tuple[str, int]:
    """One server's `CLAIM_SCRIPT` reply as `quorum_claim` reads it: (status, wait ms)."""
    status = reply_text(reply[0])
    return status, int(reply[2]) if status == "early" else 0


def reply_text(value: object) -> str:
    """A script's status string, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)
