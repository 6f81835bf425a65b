"""The `memory` bus driver: jobs and events in this process (see mega/drivers/memory/bus.py).
A config names it as `{"driver": "memory"}`.
"""

from __future__ import annotations

from mega.drivers.memory.broker import MemoryBroker, MemoryLane, MemoryMessage
from mega.drivers.memory.bus import MemoryBus
from mega.drivers.memory.receiver import MemoryReceiver
from mega.drivers.memory.urls import check_urls

__all__ = [
    "MemoryBroker",
    "MemoryBus",
    "MemoryLane",
    "MemoryMessage",
    "MemoryReceiver",
    "check_urls",
]
