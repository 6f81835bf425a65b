"""The `redis` bus driver: jobs and events on Redis Streams (see mega/drivers/redis/bus.py).
A config names it as `{"driver": "redis", "url": "redis://127.0.0.1:6379/0"}`, or on a Redis
Cluster as `{"driver": "redis", "url": "redis+cluster://10.0.0.1:7000,10.0.0.2:7000"}`.

`RedisBus` and `RedisReceiver` are imported on first use: a config's URLs are checked (urls.py)
without the Redis client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mega.drivers.redis.urls import check_urls

if TYPE_CHECKING:
    from mega.drivers.redis.bus import RedisBus
    from mega.drivers.redis.receiver import RedisReceiver

__all__ = ["RedisBus", "RedisReceiver", "check_urls"]


def __getattr__(name: str) -> Any:
    if name == "RedisBus":
        from mega.drivers.redis.bus import RedisBus

        return RedisBus
    if name == "RedisReceiver":
        from mega.drivers.redis.receiver import RedisReceiver

        return RedisReceiver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
