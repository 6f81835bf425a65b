"""The record stores of a lane (`Bus.put_records`, `Bus.get_records`), the same on every driver:
overwrite and create-only writes, order within one call, expiry, one table apart from the other
and one lane apart from another. The job statuses and results stand on these two primitives."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from mega.drivers import find_driver
from mega.drivers.base import Bus, Lane
from mega.settings import BusSpec

DRIVERS = ["nats", "redis", "memory", "postgres", "redis-cluster"]


def job_lane(prefix: str, name: str = "records", *, keep_s: float = 60) -> Lane:
    return Lane(
        "job",
        f"{prefix}_{name}",
        f"{prefix}.{name}",
        concurrency=4,
        ack_wait_s=30,
        dlq_max_age_s=3600,
        keep_status_s=keep_s,
        keep_result_s=keep_s,
    )


@pytest.fixture(params=DRIVERS)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    urls: dict[str, Callable[[], str]] = {
        "nats": lambda: request.getfixturevalue("nats_url"),
        "redis": lambda: request.getfixturevalue("redis_url"),
        "memory": lambda: "",
        "postgres": lambda: request.getfixturevalue("postgres_url"),
        "redis-cluster": lambda: request.getfixturevalue("redis_cluster_url"),
    }
    url = urls[request.param]()
    driver = request.param.removesuffix("-cluster")
    connected = await find_driver(driver).connect("jobs", BusSpec(driver=driver, url=url))
    try:
        yield connected
    finally:
        await connected.close()


async def test_a_record_is_written_read_and_overwritten(bus: Bus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    assert (await bus.get_records(lane, "status", ["a"]))[0] is None
    assert await bus.put_records(lane, "status", [("a", b'{"n":1}')], create=False) == [True]
    assert (await bus.get_records(lane, "status", ["a"]))[0] == b'{"n":1}'
    # In order within one call: the last write of a key wins.
    written = await bus.put_records(
        lane, "status", [("a", b'{"n":2}'), ("b", b"x"), ("a", b'{"n":3}')], create=False
    )
    assert written == [True, True, True]
    assert (await bus.get_records(lane, "status", ["a"]))[0] == b'{"n":3}'
    assert (await bus.get_records(lane, "status", ["b"]))[0] == b"x"


async def test_create_stores_only_keys_without_a_record(bus: Bus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    await bus.put_records(lane, "status", [("taken", b"first")], create=False)
    created = await bus.put_records(
        lane, "status", [("taken", b"second"), ("fresh", b"new")], create=True
    )
    assert created == [False, True]
    assert (await bus.get_records(lane, "status", ["taken"]))[0] == b"first"
    assert (await bus.get_records(lane, "status", ["fresh"]))[0] == b"new"
    # In order within one call: of two creates of a key, the first wins.
    twice = await bus.put_records(
        lane, "status", [("twice", b"one"), ("other", b"o"), ("twice", b"two")], create=True
    )
    assert twice == [True, True, False]
    assert await bus.get_records(lane, "status", ["twice", "other"]) == [b"one", b"o"]


async def test_tables_and_lanes_are_apart(bus: Bus, prefix: str) -> None:
    one, other = job_lane(prefix, "one"), job_lane(prefix, "other")
    for lane in (one, other):
        await bus.ensure(lane, apply_limits=False)
    await bus.put_records(one, "status", [("k", b"one status")], create=False)
    await bus.put_records(one, "result", [("k", b"one result")], create=False)
    assert (await bus.get_records(one, "status", ["k"]))[0] == b"one status"
    assert (await bus.get_records(one, "result", ["k"]))[0] == b"one result"
    assert (await bus.get_records(other, "status", ["k"]))[0] is None
    assert (await bus.get_records(other, "result", ["k"]))[0] is None


async def test_any_job_id_is_a_key_and_many_are_read_at_once(bus: Bus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    keys = ["order:42/ship", "a.b.c", "=x", "ünïcode-✓", "w" * 200, "*", ">", "lane pause"]
    await bus.put_records(lane, "status", [(key, key.encode()) for key in keys], create=False)
    assert await bus.get_records(lane, "status", [*keys, "missing"]) == [
        *(key.encode() for key in keys),
        None,
    ]
    assert (await bus.get_records(lane, "status", ["a.b"]))[0] is None


async def test_a_record_expires_its_keep_after_its_last_write(bus: Bus, prefix: str) -> None:
    lane = job_lane(prefix, keep_s=1.0)
    await bus.ensure(lane, apply_limits=False)
    await bus.put_records(lane, "status", [("short", b"v")], create=False)
    assert (await bus.get_records(lane, "status", ["short"]))[0] == b"v"
    deadline = time.monotonic() + 10
    while (await bus.get_records(lane, "status", ["short"]))[0] is not None:
        assert time.monotonic() < deadline, "the record outlived its keep by 9 s"
        await asyncio.sleep(0.1)
    # Expired: a create may take the key again.
    assert await bus.put_records(lane, "status", [("short", b"again")], create=True) == [True]
