"""`enqueue(..., session=session)`, deprecated for `outbox.enqueue` (goes in 0.3), works until
then: on the postgres driver the job is written in the caller's transaction, so it exists if
and only if that transaction commits; other drivers refuse it and store nothing. It warns once
per process, naming what replaces it."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from mega import Job, JobQueue, JobRunner
from mega.config import load_config
from mega.errors import JobError
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.jobs.test_contract import POSTGRES_BUS

RAN: list[Any] = []
# The tests of what the old spelling still does; the warning has a test of its own.
OLD_SPELLING = pytest.mark.filterwarnings(
    r"ignore:enqueue\(\.\.\., session=\.\.\.\) is deprecated:DeprecationWarning"
)


class ShipOrder(Job):
    subject = "orders.ship"
    bus = "jobs"

    async def run(self, payload: Any, ctx: Any) -> None:
        RAN.append(payload)


@OLD_SPELLING
async def test_the_job_exists_if_and_only_if_the_transaction_commits(
    tmp_path: Path, nats_url: str, redis_url: str, postgres_url: str
) -> None:
    body = POSTGRES_BUS % postgres_url + f"services['database'] = {{'url': {postgres_url!r}}}\n"
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    ctx = await boot(config, role="test")  # the database migrated: the bus's tables too
    queue = JobQueue(ctx, "jobs")
    RAN.clear()
    try:
        with ctx.db.sessions.begin() as session:
            session.execute(text("CREATE TABLE orders (id int PRIMARY KEY)"))
        with pytest.raises(RuntimeError), ctx.db.sessions.begin() as session:
            session.execute(text("INSERT INTO orders VALUES (1)"))
            await queue.enqueue(ShipOrder, {"order": 1}, session=session)
            raise RuntimeError("the order is refused after all: roll back")
        assert (await queue.stats(ShipOrder)).pending == 0
        with ctx.db.sessions.begin() as session:
            session.execute(text("INSERT INTO orders VALUES (2)"))
            job_id = await queue.enqueue(ShipOrder, {"order": 2}, session=session)
            assert (await queue.stats(ShipOrder)).pending == 0  # not committed yet
        assert (await queue.stats(ShipOrder)).pending == 1
        worker = JobRunner(ctx)
        worker.register(ShipOrder)
        await worker.start()
        try:
            async with asyncio.timeout(10):
                while not RAN:
                    await asyncio.sleep(0.02)
        finally:
            await worker.stop(1)
        assert RAN == [{"order": 2}] and len(job_id) == 32
    finally:
        await shutdown(ctx)


@OLD_SPELLING
async def test_a_bus_whose_jobs_are_not_in_the_database_refuses_a_session(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url))
    ctx = await boot(config, role="test")
    queue = JobQueue(ctx, "jobs")
    job = type("ShipOrder", (ShipOrder,), {"subject": f"orders.{tmp_path.name[-8:]}"})
    try:
        with ctx.db.sessions.begin() as session, pytest.raises(JobError) as caught:
            await queue.enqueue(job, {"order": 3}, session=session)
        assert caught.value.code == "job.session_unsupported"
        assert "the postgres driver" in str(caught.value)
        assert (await queue.stats(job)).pending == 0
    finally:
        await shutdown(ctx)


async def test_the_session_spelling_warns_once_naming_the_outbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from mega import deprecation
    from mega.testing import memory_context

    monkeypatch.setattr(deprecation, "_warned", set())
    ctx = memory_context("jobs")
    with Session(create_engine("sqlite://")) as session:
        with (
            pytest.warns(
                DeprecationWarning,
                match=r"enqueue\(\.\.\., session=\.\.\.\) is deprecated and goes in mega 0\.3: "
                r"use outbox\.enqueue\(session, Job, payload\) in the transaction, on any bus",
            ) as caught,
            pytest.raises(JobError),  # the memory bus cannot join a transaction
        ):
            await ShipOrder.enqueue(ctx, {"order": 4}, session=session)
        assert caught[0].filename == __file__  # it points at the caller's line
        with warnings.catch_warnings(), pytest.raises(JobError):
            warnings.simplefilter("error")  # once per process: the second call is quiet
            await JobQueue(ctx, "jobs").enqueue(ShipOrder, {"order": 5}, session=session)
