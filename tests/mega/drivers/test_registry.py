"""Drivers are found by name: the built-in ones, and one a package adds through the
`mega.drivers` entry-point group, installed here from tests/mega/drivers/tiny_driver."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mega import Job, JobRunner
from mega.config import load_config
from mega.context import Context
from mega.drivers import driver_names, find_driver
from mega.errors import ConfigError
from mega.runtime.bootstrap import boot, shutdown
from mega.settings import BusSpec
from tests.factories import write_config

TINY = Path(__file__).parent / "tiny_driver"
TINY_BUS = """
services = {
    "caches": services["caches"], "locks": services["locks"],
    "buses": {"jobs": {"driver": "tiny"}}, "database": services["database"],
}
"""
RAN: list[Any] = []


class Ping(Job):
    subject = "tiny.ping"
    bus = "jobs"

    async def run(self, payload: Any, ctx: Any) -> None:
        RAN.append(payload)


@pytest.mark.parametrize("name", ["nats", "redis", "memory", "postgres"])
def test_the_built_in_drivers_are_found_by_name(name: str) -> None:
    assert find_driver(name).driver == name


def test_an_unknown_driver_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown bus driver 'kafka' \(known: memory, nats, "):
        find_driver("kafka")


@pytest.fixture
def tiny_installed(tmp_path: Path) -> Iterator[None]:
    """pip installs the tiny driver into a folder of this test, put on sys.path."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(target),
            str(TINY),
        ],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(target))
        sys.modules.pop("tiny_mega_driver", None)


async def test_a_driver_a_package_adds_runs_a_job(
    tiny_installed: None, tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    assert "tiny" in driver_names()
    path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=TINY_BUS)
    ctx = await boot(load_config(path), role="test", database=False)
    worker = JobRunner(ctx)
    worker.register(Ping)
    await worker.start()
    try:
        assert ctx.bus("jobs").driver == "tiny"
        await worker.queue("jobs").enqueue(Ping, {"n": 1})
        async with asyncio.timeout(5):
            while not RAN:
                await asyncio.sleep(0.01)
        assert RAN == [{"n": 1}]
    finally:
        await worker.stop(1)
        await shutdown(ctx)


def test_a_driver_a_package_adds_checks_the_urls_a_config_gives_it(
    tiny_installed: None, tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    body = TINY_BUS.replace('{"driver": "tiny"}', '{"driver": "tiny", "url": "tiny://a,tiny://b"}')
    path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    assert load_config(path).buses["jobs"].url == "tiny://a,tiny://b"  # two: its own rule
    path.write_text(path.read_text().replace("tiny://b", "http://b"))
    with pytest.raises(ConfigError, match=r"services\.buses\.jobs\.url: .*takes tiny:// URLs"):
        load_config(path)


def test_a_config_naming_an_unknown_driver_is_refused(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    body = TINY_BUS.replace('"tiny"', '"kafka"')
    path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    with pytest.raises(ConfigError, match=r"services\.buses\.jobs\.driver: unknown driver 'kafka'"):
        load_config(path)


@pytest.mark.parametrize("name", ["nats", "redis", "memory", "postgres"])
async def test_a_context_built_by_hand_runs_a_job_on_every_driver(
    name: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    urls = {"nats": "nats_url", "redis": "redis_url", "postgres": "postgres_url"}
    url = request.getfixturevalue(urls[name]) if name in urls else ""
    bus = await find_driver(name).connect("jobs", BusSpec(driver=name, url=url))
    ctx = Context(instance_id="by-hand", buses={"jobs": bus})
    job = type("Ping", (Ping,), {"subject": f"{prefix}.ping"})
    worker = JobRunner(ctx)
    worker.register(job)
    RAN.clear()
    await worker.start()
    try:
        await worker.queue("jobs").enqueue(job, {"driver": name})
        async with asyncio.timeout(10):
            while not RAN:
                await asyncio.sleep(0.01)
        assert [{"driver": name}] == RAN
        assert ctx.bus("jobs", type(bus)) is bus  # typed as its driver: .native is its client
        with pytest.raises(ConfigError, match=r"services\.buses\.jobs: a \w+ bus, not "):
            ctx.bus("jobs", find_driver("memory" if name != "memory" else "nats"))
    finally:
        await worker.stop(1)
        await bus.close()
