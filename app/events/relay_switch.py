"""The demo's pause switch for the outbox relay: a flag in Redis that the relay of every
`mega worker` reads before each batch (`outbox = {"paused": relay_paused}` in mega_config.py).
Paused, signups keep committing and their events pile up in the outbox; resumed, they drain."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mega import Context

if TYPE_CHECKING:
    from mega import RedisClient

PAUSED_KEY = "demo:outbox:paused"


async def relay_paused(ctx: Context) -> bool:
    return bool(await ctx.cache("main").native.get(PAUSED_KEY) == "1")


async def set_paused(redis: RedisClient, paused: bool) -> None:
    if paused:
        await redis.set(PAUSED_KEY, "1")
    else:
        await redis.delete(PAUSED_KEY)


async def is_paused(redis: RedisClient) -> bool:
    return bool(await redis.get(PAUSED_KEY) == "1")
