"""The `redis` bus driver: jobs and events on Redis Streams (see mega/drivers/redis/bus.py).
A config names it as `{"driver": "redis", "url": "redis://127.0.0.1:6379/0"}`, or on a Redis
Cluster as `{"driver": "redis", "url": "redis+cluster://10.0.0.1:7000,10.0.0.2:7000"}`.
"""

from __future__ import annotations

from mega.drivers.redis.bus import RedisBus
from mega.drivers.redis.receiver import RedisReceiver

__all__ = ["RedisBus", "RedisReceiver"]
