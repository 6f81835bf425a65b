"""The pieces of flow control: the rate limit's declaration (a plain sentence for a bad one),
its shared log on a real Redis (grants up to the limit, what is given back is granted again,
the wait until the window frees one), a log per key, `key_concurrency`'s leases (capped per
key, lapsing unless renewed, dropped when a run ends, none granted by a cache that does not
answer), and `mega check` naming a cache the config lacks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from mega import Context, Job
from mega.config import load_config
from mega.drivers.base import Delivery
from mega.errors import RegistrationError
from mega.jobs.spec import validate_job
from mega.lanes.flow import KeySlots
from mega.lanes.ratelimit import RateLimit, RateLimiter
from mega.runtime.check import check_jobs
from tests.factories import write_config
from tests.processes import free_port_base


def job_with(rate_limit: Any) -> type[Job]:
    async def run(self: Any, payload: Any, ctx: Context) -> None:
        return None

    attributes = {"subject": "limited.job", "bus": "jobs", "rate_limit": rate_limit, "run": run}
    return type("LimitedJob", (Job,), attributes)


@pytest.mark.parametrize(
    "rate_limit",
    [
        {"limit": 0, "period_s": 1},
        {"limit": 5},
        {"limit": 5, "period_s": 0},
        {"limit": 5, "period_s": 1, "per": "key", "extra": True},
        {"limit": True, "period_s": 1},
        "20/s",
    ],
)
def test_a_bad_rate_limit_is_one_sentence(rate_limit: Any) -> None:
    with pytest.raises(RegistrationError) as raised:
        validate_job(job_with(rate_limit), {"jobs"})
    assert 'rate_limit: must be None (no limit) or {"limit": starts >= 1' in str(raised.value)


@pytest.mark.parametrize("cap", [0, -1, 1.5, "2", True])
def test_a_bad_key_concurrency_is_one_sentence(cap: Any) -> None:
    job = type("Capped", (job_with(None),), {"key_concurrency": cap})
    with pytest.raises(RegistrationError) as raised:
        validate_job(job, {"jobs"})
    assert "key_concurrency: must be None (no cap) or an int >= 1" in str(raised.value)


def test_a_good_rate_limit_is_in_the_spec() -> None:
    spec = validate_job(job_with({"limit": 20, "period_s": 1}), {"jobs"})
    assert spec.rate_limit == RateLimit(limit=20, period_s=1)
    assert validate_job(job_with(None), {"jobs"}).rate_limit is None


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_the_log_grants_up_to_the_limit_and_takes_back_what_did_not_start(
    redis: Redis, prefix: str
) -> None:
    limiter = RateLimiter(redis, f"{prefix}:rate", RateLimit(limit=10, period_s=30))
    first = await limiter.take(15)
    assert len(first.members) == 10 and first.wait_s == 0  # wait: only when none was granted
    refused = await limiter.take(1)
    assert refused.members == [] and 0.9 <= refused.wait_s <= 1.0  # capped at MAX_WAIT_S
    await limiter.settle(first, 4)  # 4 started, 6 given back
    again = await limiter.take(10)
    assert len(again.members) == 6
    assert await redis.zcard(f"{prefix}:rate") == 10


async def test_the_window_frees_a_grant_once_it_is_a_period_old(redis: Redis, prefix: str) -> None:
    limiter = RateLimiter(redis, f"{prefix}:rate", RateLimit(limit=2, period_s=0.3))
    assert len((await limiter.take(2)).members) == 2
    refused = await limiter.take(2)
    assert refused.members == [] and 0 < refused.wait_s <= 0.3
    await asyncio.sleep(refused.wait_s + 0.02)
    assert len((await limiter.take(2)).members) == 2


async def test_a_limit_per_key_keeps_a_log_for_each_key(redis: Redis, prefix: str) -> None:
    limiter = RateLimiter(redis, f"{prefix}:rate", RateLimit(limit=2, period_s=30, per="key"))
    assert len((await limiter.take(5, "big")).members) == 2
    assert (await limiter.take(1, "big")).members == []
    assert len((await limiter.take(5, "small")).members) == 2  # big's use is not small's
    assert len((await limiter.take(5, None)).members) == 2  # no key: one key of its own
    assert await redis.zcard(f"{prefix}:rate:key:big") == 2


def delivery(n: int, key: str | None) -> Delivery:
    return Delivery(f"job-{n}", "s", b"{}", 1, None, None, n, None, flow_key=key)


async def test_leases_cap_a_key_lapse_unless_renewed_and_go_when_runs_end(
    redis: Redis, prefix: str
) -> None:
    slots = KeySlots(redis, f"{prefix}:slots", cap=2, lease_s=0.4)
    a0, a1, a2, b0 = delivery(0, "a"), delivery(1, "a"), delivery(2, "a"), delivery(3, "b")
    assert await slots.take("a", [a0, a1, a2]) == 2  # the first two
    assert await slots.take("b", [b0]) == 1  # another key's cap is its own
    assert await slots.take("a", [a2]) == 0
    await asyncio.sleep(0.25)
    await slots.renew([a1])  # a0's lease is left to lapse, as a crashed worker's would
    await asyncio.sleep(0.2)
    assert await slots.take("a", [a2]) == 1  # a0's lapsed; a1's renewed one holds
    assert await redis.zcard(f"{prefix}:slots:a") == 2
    slots.ended(a1)
    slots.ended(a2)
    slots.ended(b0)
    await slots.close()
    assert await redis.zcard(f"{prefix}:slots:a") == 0
    assert await redis.zcard(f"{prefix}:slots:b") == 0


async def test_a_cache_that_does_not_answer_grants_no_lease(prefix: str) -> None:
    gone = Redis(port=free_port_base(0), socket_connect_timeout=0.5)
    try:
        slots = KeySlots(gone, f"{prefix}:slots", cap=5, lease_s=1)
        assert await slots.take("a", [delivery(0, "a")]) == 0  # fails closed
        assert slots.held == {}
    finally:
        await gone.aclose()


def test_check_names_a_rate_limits_missing_cache(tmp_path: Path, nats_url: str) -> None:
    body = (
        "from tests.mega.lanes.test_ratelimit import NamedCache, OnlyCache\n"
        "jobs = [NamedCache, OnlyCache]\n"
    )
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=None, body=body))
    found = {(f.subject, f.message) for f in check_jobs(config) if f.level == "error"}
    assert found == {
        (
            "jobs: NamedCache",
            "flow_cache names cache 'nope', which services.caches lacks (declared: none)",
        ),
        (
            "jobs: OnlyCache",
            "rate_limit and key_concurrency count in a cache; the config "
            'declares none: name one with flow_cache = "<alias>"',
        ),
    }


class NamedCache(Job):
    subject = "limited.named"
    bus = "jobs"
    rate_limit = {"limit": 5, "period_s": 1.0}
    flow_cache = "nope"

    async def run(self, payload: Any, ctx: Context) -> None:
        return None


class OnlyCache(Job):
    subject = "limited.only"
    bus = "jobs"
    rate_limit = {"limit": 5, "period_s": 1.0}

    async def run(self, payload: Any, ctx: Context) -> None:
        return None
