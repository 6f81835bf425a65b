"""The Lua scripts `RedLock` runs on each Redis server (`mega.schedules.locks`).

A script runs atomically on one server: what must not interleave with a peer's commands (check a
token, then delete; take a claim, then a guard, then a fence) is one script. redis-py's
`register_script` sends each by its SHA1 (EVALSHA) and loads it again after a server restart.
"""

from __future__ import annotations

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
# `acquire_fenced` on one server, atomically: KEYS = guard, fence[, claim]; ARGV = token, guard
# ttl ms, fence floor[, claim ttl ms]. The claim is taken first and kept even on "overlap" (tick
# consumed). The fence is the counter plus one, or the floor when that is larger: a counter
# lost with a Redis restarted empty starts again above every fence drawn before.
# INCR comes before the guard's SET: a script that fails half-way keeps its earlier writes, and a
# fence key holding a non-number must not leave a guard behind that blocks the next ticks.
ACQUIRE_FENCED_SCRIPT = """
if #KEYS == 3 and not redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[4]) then
    return {'claimed'}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
    return {'overlap'}
end
local fence = redis.call('INCR', KEYS[2])
if fence < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[2], ARGV[3])
    fence = ARGV[3]
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {'acquired', fence}
"""
