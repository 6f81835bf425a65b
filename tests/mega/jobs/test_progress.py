"""`ctx.progress(fraction, note)`: the check of its arguments (a table, no broker), and the
`progress` signal a JobQueue sends and a JobRunner re-sends, proven on every bus driver: the
`nats` driver on the session's nats-server, `redis` on its Redis, `memory` in this process."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mega import Context, Job, JobContext, JobRunner
from mega.config import load_config
from mega.runtime.bootstrap import boot, shutdown
from mega.validation import MAX_NOTE_CHARS
from mega.validation import progress_fraction as check_fraction
from mega.validation import progress_note as check_note
from tests.factories import write_config
from tests.mega.jobs.test_contract import until

MEMORY_BUS = """
services = {
    "caches": services["caches"], "locks": services["locks"],
    "buses": {"jobs": {"driver": "memory"}}, "database": services["database"],
}
"""
REDIS_BUS = """
services = {
    "caches": services["caches"], "locks": services["locks"],
    "buses": {"jobs": {"driver": "redis", "url": services["caches"]["main"]["url"]}},
    "database": services["database"],
}
"""
# What each run saw of its context: job id -> [(ctx.job_id, ctx.attempt, type(ctx).__name__)].
SEEN: dict[str, list[tuple[str, int, str]]] = {}


@pytest.mark.parametrize("fraction", [0, 0.0, 0.25, 1, 1.0])
def test_a_fraction_from_0_to_1_is_taken(fraction: float) -> None:
    assert check_fraction(fraction) == float(fraction)


@pytest.mark.parametrize(
    "fraction", [-0.01, 1.01, 2, math.nan, math.inf, True, False, "0.5", None, [0.5]]
)
def test_anything_else_is_a_value_error_naming_it(fraction: Any) -> None:
    with pytest.raises(ValueError, match=r"progress fraction must be a number from 0 to 1, got"):
        check_fraction(fraction)


def test_a_note_is_text_or_none_and_long_ones_are_cut() -> None:
    assert check_note(None) is None
    assert check_note("step 2 of 5") == "step 2 of 5"
    assert check_note("x" * (MAX_NOTE_CHARS + 50)) == "x" * MAX_NOTE_CHARS
    with pytest.raises(ValueError, match="progress note must be text or None, got int"):
        check_note(5)


class Stepper(Job):
    """Reports `steps` steps; `fail_first` runs fail after their first report; `bad` reports
    the fraction given and nothing else; `quiet` reports nothing."""

    bus = "jobs"
    retries = 1
    concurrency = 2
    backoff = {"type": "exponential", "initial": 10, "max": 20}

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
        runs = SEEN.setdefault(payload["id"], [])
        runs.append((ctx.job_id, ctx.attempt, type(ctx).__name__))
        assert ctx.cache("main").native is not None  # the host's services are all there
        if "bad" in payload:
            await ctx.progress(payload["bad"])
            return
        if payload.get("quiet"):
            return
        steps = payload.get("steps", 3)
        for step in range(1, steps + 1):
            await ctx.progress(step / steps, f"step {step} of {steps}")
            if len(runs) <= payload.get("fail_first", 0):
                raise RuntimeError("planned failure")


@pytest.fixture(params=["nats", "redis", "memory"])
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> AsyncIterator[tuple[type[Job], JobRunner, list[dict[str, Any]]]]:
    body = {"nats": "", "redis": REDIS_BUS, "memory": MEMORY_BUS}[request.param]
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    ctx = await boot(config, role="test", database=False)
    job = type("Stepper", (Stepper,), {"subject": f"{prefix}.progress"})
    worker = JobRunner(ctx, instance_id=f"worker-{prefix}")
    worker.register(job)
    seen: list[dict[str, Any]] = []
    for name in ("start", "progress", "done", "retry", "fail", "dlq"):
        worker.on(name, seen.append)
    await worker.start()
    yield job, worker, seen
    await worker.stop(5)
    await shutdown(ctx)


def of(seen: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    return [signal for signal in seen if signal["id"] == job_id]


async def test_each_report_is_a_progress_signal_between_start_and_done(
    setup: Any, prefix: str
) -> None:
    job, worker, seen = setup
    job_id = await worker.queue("jobs").enqueue(job, {"id": f"{prefix}-a", "steps": 3})
    await until(lambda: any(s["signal"] == "done" for s in of(seen, job_id)), "done")
    signals = of(seen, job_id)
    assert [s["signal"] for s in signals] == ["start", "progress", "progress", "progress", "done"]
    assert signals[1] == {
        "signal": "progress",
        "job": "Stepper",
        "id": job_id,
        "attempt": 1,
        "fraction": 1 / 3,
        "note": "step 1 of 3",
        "worker": f"worker-{prefix}",
    }
    assert [(s["fraction"], s["note"]) for s in signals[2:4]] == [
        (2 / 3, "step 2 of 3"),
        (1.0, "step 3 of 3"),
    ]
    assert SEEN[f"{prefix}-a"] == [(job_id, 1, "JobContext")]


async def test_a_retried_job_reports_per_attempt(setup: Any, prefix: str) -> None:
    job, worker, seen = setup
    payload = {"id": f"{prefix}-b", "steps": 2, "fail_first": 1}
    job_id = await worker.queue("jobs").enqueue(job, payload)
    await until(lambda: any(s["signal"] == "done" for s in of(seen, job_id)), "done")
    assert [(s["signal"], s["attempt"]) for s in of(seen, job_id)] == [
        ("start", 1),
        ("progress", 1),
        ("retry", 1),
        ("start", 2),
        ("progress", 2),
        ("progress", 2),
        ("done", 2),
    ]
    assert [attempt for _, attempt, _ in SEEN[f"{prefix}-b"]] == [1, 2]


async def test_a_bad_fraction_fails_the_attempt_and_sends_nothing(setup: Any, prefix: str) -> None:
    job, worker, seen = setup
    job_id = await worker.queue("jobs").enqueue(job, {"id": f"{prefix}-c", "bad": 1.5})
    await until(lambda: any(s["signal"] == "dlq" for s in of(seen, job_id)), "dlq")
    signals = of(seen, job_id)
    assert not [s for s in signals if s["signal"] == "progress"]
    retry = next(s for s in signals if s["signal"] == "retry")
    assert retry["error_type"] == "ValueError"
    assert retry["error"] == "progress fraction must be a number from 0 to 1, got 1.5"


async def test_a_job_that_reports_nothing_sends_no_progress(setup: Any, prefix: str) -> None:
    job, worker, seen = setup
    job_id = await worker.queue("jobs").enqueue(job, {"id": f"{prefix}-d", "quiet": True})
    await until(lambda: any(s["signal"] == "done" for s in of(seen, job_id)), "done")
    assert [s["signal"] for s in of(seen, job_id)] == ["start", "done"]


async def test_the_queue_itself_sends_it_to_its_observers(setup: Any, prefix: str) -> None:
    job, worker, _ = setup
    direct: list[dict[str, Any]] = []
    worker.queue("jobs").on("progress", direct.append)
    job_id = await worker.queue("jobs").enqueue(job, {"id": f"{prefix}-e", "steps": 1})
    await until(lambda: len(direct) == 1, "progress")
    (signal,) = direct
    assert (signal["id"], signal["fraction"], signal["note"]) == (job_id, 1.0, "step 1 of 1")


async def test_the_run_context_shares_the_hosts_services_and_opens_no_database(
    tmp_path: Path,
) -> None:
    base = Context(instance_id="host", database_url=f"sqlite:///{tmp_path / 'x.db'}")
    reports: list[tuple[str, dict[str, Any]]] = []

    async def report(name: str, **fields: Any) -> None:
        reports.append((name, fields))

    first, second = (
        JobContext.for_run(base, job="J", job_id=f"id{n}", attempt=n, worker="w", report=report)
        for n in (1, 2)
    )
    assert first.buses is base.buses and first.extras is base.extras
    assert first.database is None  # not opened yet: nothing is opened per run
    assert first.db is second.db is base.db  # opened once, on the host's context
    assert first.database is base.database is not None
    await second.progress(0.5)
    assert reports == [
        (
            "progress",
            {"job": "J", "id": "id2", "attempt": 2, "fraction": 0.5, "note": None, "worker": "w"},
        ),
    ]
    base.db.dispose()
