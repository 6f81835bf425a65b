"""The rate limit's pieces: its declaration (a plain sentence for a bad one), the shared log on
a real Redis (grants up to the limit, what is given back is granted again, the wait until the
window frees one), and `mega check` naming a cache the config lacks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from mega import Context, Job
from mega.config import load_config
from mega.errors import RegistrationError
from mega.jobs.ratelimit import RateLimit, RateLimiter
from mega.jobs.spec import validate_job
from mega.runtime.check import check_jobs
from tests.factories import write_config


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
    import asyncio

    await asyncio.sleep(refused.wait_s + 0.02)
    assert len((await limiter.take(2)).members) == 2


def test_check_names_a_rate_limits_missing_cache(tmp_path: Path, nats_url: str) -> None:
    body = (
        "from tests.mega.jobs.test_ratelimit import NamedCache, OnlyCache\n"
        "jobs = [NamedCache, OnlyCache]\n"
    )
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=None, body=body))
    found = {(f.subject, f.message) for f in check_jobs(config) if f.level == "error"}
    assert found == {
        ("jobs: NamedCache", "rate_limit names cache 'nope', which services.caches lacks "
                             "(declared: none)"),
        ("jobs: OnlyCache", 'rate_limit counts starts in a cache; the config declares none: '
                            'name one with "cache" in rate_limit'),
    }  # fmt: skip


class NamedCache(Job):
    subject = "limited.named"
    bus = "jobs"
    rate_limit = {"limit": 5, "period_s": 1.0, "cache": "nope"}

    async def run(self, payload: Any, ctx: Context) -> None:
        return None


class OnlyCache(Job):
    subject = "limited.only"
    bus = "jobs"
    rate_limit = {"limit": 5, "period_s": 1.0}

    async def run(self, payload: Any, ctx: Context) -> None:
        return None
