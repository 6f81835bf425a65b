"""The job queue's contract, written once and proven on every bus driver: exact attempt counts,
DLQ records, requeue, dedup ids, delay, enqueue_many, bad payloads and the drain. The `nats`
driver runs on the session's nats-server, `redis` on its Redis, `redis-cluster` is the redis
driver on the session's Redis Cluster (its cache and lock too), `memory` in this process."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mega import CallNext, Context, Job, JobContext, JobQueue, JobRunner, Run
from mega.config import load_config
from mega.drivers.base import DlqRecord, DriverUnavailable, Message
from mega.errors import JobError, JobFailed, Permanent
from mega.jobs.spec import job_lane
from mega.lanes import records as records_module
from mega.lanes.control import PAUSE_KEY, Cancelled
from mega.lanes.delivery import stand_in_id
from mega.lanes.records import ErrorInfo
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import until_cancelled, write_config
from tests.settled import settled

RUNS: Counter[str] = Counter()  # job id -> runs started
DONE: Counter[str] = Counter()  # job id -> runs that succeeded
MEMORY_BUS = """
services = {
    "caches": services["caches"], "locks": services["locks"],
    "buses": {"jobs": {"driver": "memory"}}, "database": services["database"],
}
"""
POSTGRES_BUS = """
services = {
    "caches": services["caches"], "locks": services["locks"],
    "buses": {"jobs": {"driver": "postgres", "url": %r}}, "database": services["database"],
}
"""
DRIVERS = ["nats", "redis", "memory", "postgres"]
# The contract suites prove the redis driver on a Redis Cluster too.
CONTRACT_DRIVERS = [*DRIVERS, "redis-cluster"]
REDIS_BUS = """
services = {
    "caches": services["caches"], "locks": services["locks"],
    "buses": {"jobs": {"driver": "redis", "url": services["caches"]["main"]["url"]}},
    "database": services["database"],
}
"""


class Contract(Job):
    """`fail_first` in the payload: how many runs fail before one succeeds."""

    bus = "jobs"
    retries = 2
    concurrency = 4
    backoff = {"type": "exponential", "initial": 10, "max": 20}

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
        RUNS[payload["id"]] += 1
        await asyncio.sleep(payload.get("sleep_s", 0))
        if RUNS[payload["id"]] <= payload.get("fail_first", 0):
            raise RuntimeError(f"planned failure {RUNS[payload['id']]}")
        DONE[payload["id"]] += 1


class Order(BaseModel):
    id: str
    sleep_s: float = 0


TYPED: dict[str, list[tuple[type, bool]]] = {}  # order id -> (payload type, on the loop thread)


class Typed(Job):
    """A `schema` and a plain `def run`, which sleeps (blocking) `sleep_s` on its thread."""

    bus = "jobs"
    schema = Order
    ack_wait_s = 0.6
    concurrency = 2

    def run(self, order: Order, ctx: Context) -> None:
        TYPED.setdefault(order.id, []).append(
            (type(order), threading.current_thread() is threading.main_thread())
        )
        time.sleep(order.sleep_s)
        DONE[order.id] += 1


class Limited(Job):
    """A wall-clock limit and errors that skip the retries: `mode` says what a run does."""

    bus = "jobs"
    timeout_s = 0.3
    retries = 1
    backoff = {"type": "exponential", "initial": 10, "max": 10}
    permanent = (KeyError,)
    concurrency = 4

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        RUNS[payload["id"]] += 1
        mode = payload["mode"]
        if mode == "hang":
            await until_cancelled()  # the run itself, until its time limit ends it
        elif mode == "own_timeout":
            raise TimeoutError("the run's own")
        elif mode == "permanent":
            raise Permanent("the order is gone")
        elif mode == "key":
            raise KeyError("sku")
        DONE[payload["id"]] += 1


class Tracked(Job):
    """Keeps its results: returns what the payload says after `fail_first` failures."""

    bus = "jobs"
    retries = 1
    backoff = {"type": "exponential", "initial": 10, "max": 10}
    keep_result_s = 60
    concurrency = 4

    async def run(self, payload: dict[str, Any], ctx: Context) -> Any:
        RUNS[payload["id"]] += 1
        if RUNS[payload["id"]] <= payload.get("fail_first", 0):
            raise RuntimeError(f"planned failure {RUNS[payload['id']]}")
        return payload.get("returns")


def driver_of(param: str) -> str:
    """The bus driver a param runs (`redis-cluster`: the redis driver)."""
    return param.removesuffix("-cluster")


def bus_body(request: pytest.FixtureRequest) -> str:
    """The config lines that put the `jobs` bus on the driver `request.param` names."""
    if request.param == "postgres":
        postgres_url: str = request.getfixturevalue("postgres_url")
        return POSTGRES_BUS % postgres_url
    return {"nats": "", "redis": REDIS_BUS, "memory": MEMORY_BUS}[driver_of(request.param)]


def config_redis_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    """The URL of the config's cache (and lock): the session's Redis Cluster's for the
    `redis-cluster` param, else its Redis."""
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster_url"))
    return redis_url


@pytest.fixture(params=CONTRACT_DRIVERS)
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> AsyncIterator[tuple[Context, type[Job], JobQueue, list[dict[str, Any]]]]:
    body = bus_body(request)
    redis_url = config_redis_url(request, redis_url)
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    ctx = await boot(config, role="test", database=False)
    job: type[Contract] = type("Contract", (Contract,), {"subject": f"{prefix}.contract"})
    worker = JobRunner(ctx)
    worker.register(job)
    seen: list[dict[str, Any]] = []
    for name in ("start", "done", "retry", "fail", "dlq"):
        worker.on(name, seen.append)
    await worker.start()
    queue = worker.queue("jobs")
    assert queue.bus.driver == driver_of(request.param)
    yield ctx, job, queue, seen
    await worker.stop(5)
    await shutdown(ctx)


async def until(check: Any, what: str, timeout_s: float = 15) -> None:
    """Poll `check` (a function, or one returning an awaitable) until it is true."""
    deadline = time.monotonic() + timeout_s
    while not (await found if inspect.isawaitable(found := check()) else found):
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.01)


def wrap_receivers(
    monkeypatch: pytest.MonkeyPatch, bus: Any, wraps: dict[str, Callable[[Any], Any]]
) -> None:
    """Each receiver `bus` makes from now on calls `wraps[name](its own method)` instead of
    its method `name` (a planned failure, a read at the settle)."""
    make_receiver = bus.receiver

    def receiver(lane: Any, *, consumer: str) -> Any:
        made = make_receiver(lane, consumer=consumer)
        for name, wrap in wraps.items():
            monkeypatch.setattr(made, name, wrap(getattr(made, name)))
        return made

    monkeypatch.setattr(bus, "receiver", receiver)


@contextlib.asynccontextmanager
async def running(ctx: Context, job: type[Job]) -> AsyncIterator[JobRunner]:
    """A JobRunner on `job` in this process, stopped (drained) on the way out."""
    worker = JobRunner(ctx)
    worker.register(job)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop(5)


def signals(seen: list[dict[str, Any]], job_id: str) -> list[tuple[str, int | None]]:
    return [(s["signal"], s.get("attempt") or s.get("attempts")) for s in seen if s["id"] == job_id]


async def test_ok_runs_once(setup: Any, prefix: str) -> None:
    _, job, queue, seen = setup
    job_id = await queue.enqueue(job, {"id": f"{prefix}-ok"})
    await until(lambda: len(signals(seen, job_id)) == 2, "done")
    await asyncio.sleep(0.1)
    assert RUNS[f"{prefix}-ok"] == 1 and job_id
    assert signals(seen, job_id) == [("start", 1), ("done", 1)]


async def test_a_failure_is_retried_then_succeeds(setup: Any, prefix: str) -> None:
    _, job, queue, seen = setup
    before_ms = int(time.time() * 1000)
    job_id = await queue.enqueue(job, {"id": f"{prefix}-flaky", "fail_first": 1})
    await until(lambda: len(signals(seen, job_id)) == 4, "done")
    after_ms = int(time.time() * 1000)
    assert RUNS[f"{prefix}-flaky"] == 2
    assert signals(seen, job_id) == [("start", 1), ("retry", 1), ("start", 2), ("done", 2)]
    # The retry says when the next attempt is due (epoch ms): the backoff's draw from the
    # failure, and no later than the attempt that followed.
    [retry] = [s for s in seen if s["id"] == job_id and s["signal"] == "retry"]
    assert before_ms + retry["delay_ms"] <= retry["run_at"] <= after_ms


async def test_retries_plus_one_attempts_then_the_dlq_and_requeue(setup: Any, prefix: str) -> None:
    _, job, queue, seen = setup
    key = f"{prefix}-fail"
    job_id = await queue.enqueue(job, {"id": key, "fail_first": 3}, id=key)
    await until(lambda: any(s["signal"] == "dlq" for s in seen), "dlq")
    assert RUNS[key] == 3 and DONE[key] == 0
    assert [s for s, _ in signals(seen, job_id)] == [
        "start",
        "retry",
        "start",
        "retry",
        "start",
        "fail",
        "dlq",
    ]
    assert await queue.dlq.count(job) == 1
    [record] = await queue.dlq.list(job)
    assert (record["id"], record["subject"], record["attempts"]) == (key, f"{prefix}.contract", 3)
    assert record["payload"] == {"id": key, "fail_first": 3}
    assert record["error"] == {"type": "RuntimeError", "message": "planned failure 3"}
    assert record["worker"] and record["first_enqueued_at"] and record["failed_at"]
    # Requeued, its attempts start again at 1 (and the 4th run overall succeeds). Once its
    # record says dlq (the worker sends it a moment after the dead letter), as for any
    # requeue of a job someone saw dead-lettered.
    await until(lambda: status_is(queue, job, job_id, "dlq"), "its record dlq")
    assert await queue.dlq.requeue(job, key) == 1
    requeued = await queue.status(job, job_id)  # a new run: no longer the old one's dlq
    assert requeued is not None and requeued.state in ("queued", "running", "done")
    await until(lambda: signals(seen, job_id)[-1] == ("done", 1), "requeued run")
    assert signals(seen, job_id)[-2:] == [("start", 1), ("done", 1)] and DONE[key] == 1
    assert await queue.dlq.count(job) == 0
    assert await queue.dlq.requeue(job, "nope") == 0
    # Its runs before the requeue are kept apart, the last one's dead letter included.
    await until(lambda: status_is(queue, job, job_id, "done"), "the requeued run's record")
    status = await queue.status(job, job_id)
    assert status is not None and (status.attempts, status.requeues) == (1, 1)
    assert [(a.attempt, a.state) for a in status.before_requeue] == [
        (1, "retrying"),
        (2, "retrying"),
        (3, "dlq"),
    ]
    assert status.before_requeue[-1].error == ErrorInfo(
        type="RuntimeError", message="planned failure 3"
    )


async def test_a_requeued_job_that_ends_at_once_keeps_its_done(
    setup: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeue says `queued` before it stores the job again: a worker that runs the job and
    writes `done` before the requeue returns keeps it (a `queued` written after hid it)."""
    _, job, queue, _seen = setup
    key = f"{prefix}-again"
    job_id = await queue.enqueue(job, {"id": key, "fail_first": 3}, id=key)
    await until(lambda: status_is(queue, job, job_id, "dlq"), "its record dlq")
    bus = queue.dlq.bus
    store = bus.requeue

    async def store_and_let_it_run(lane: Any, record: Any) -> None:
        await store(lane, record)
        await until(lambda: status_is(queue, job, job_id, "done"), "the requeued run's done")

    monkeypatch.setattr(bus, "requeue", store_and_let_it_run)
    assert await queue.dlq.requeue(job, key) == 1
    assert await status_is(queue, job, job_id, "done")
    assert DONE[key] == 1


async def test_an_id_is_a_dedup_key(setup: Any, prefix: str) -> None:
    _, job, queue, _seen = setup
    key = f"{prefix}-dedup"
    first = await queue.enqueue(job, {"id": key}, id=key)
    again = await queue.enqueue(job, {"id": key}, id=key)
    assert (first, first.duplicate) == (key, False)
    assert (again, again.duplicate) == (key, True)
    await until(lambda: DONE[key] == 1, "done")
    await asyncio.sleep(0.3)
    assert RUNS[key] == 1


async def test_one_id_enqueued_at_once_many_times_is_one_job_and_no_error(
    setup: Any, prefix: str
) -> None:
    """A retry racing its first try (the same id while the first is still being stored) is a
    duplicate, not a failure: every call answers the id, and the job runs once."""
    _, job, queue, _seen = setup
    key = f"{prefix}-race"
    answers = await asyncio.gather(*(queue.enqueue(job, {"id": key}, id=key) for _ in range(20)))
    assert answers == [key] * 20
    assert [answer.duplicate for answer in answers].count(False) == 1  # one call stored it
    await until(lambda: DONE[key] == 1, "done")
    await asyncio.sleep(0.3)
    assert RUNS[key] == 1


async def test_a_delayed_job_waits_without_a_slot(setup: Any, prefix: str) -> None:
    _, job, queue, seen = setup
    started = time.monotonic()
    later = await queue.enqueue(job, {"id": f"{prefix}-later"}, delay=1.5)
    now = await queue.enqueue(job, {"id": f"{prefix}-now"})
    await until(lambda: DONE[f"{prefix}-later"] == 1, "the delayed job")
    assert time.monotonic() - started >= 1.4
    # It did not block the job behind it, which started first (in whatever time a loaded
    # machine takes; a race against the delay here once failed a run).
    starts = [s["id"] for s in seen if s["signal"] == "start" and s["id"] in (later, now)]
    assert starts == [now, later]


async def test_a_job_backing_off_holds_no_slot(setup: Any, prefix: str) -> None:
    """200 jobs that fail and back off (full jitter, up to a minute), two slots: a new job still
    starts at once (a retry waits as a scheduled message, a sorted-set member or a timer, not
    in a slot)."""
    ctx, _job, _queue, _seen = setup
    backoff = {"type": "exponential", "initial": 60_000, "max": 60_000}
    narrow: type[Contract] = type(
        "Narrow",
        (Contract,),
        {
            "subject": f"{prefix}.narrow",
            "concurrency": 2,
            "retries": 1,
            "backoff": backoff,
        },
    )
    worker = JobRunner(ctx)
    worker.register(narrow)
    seen: list[dict[str, Any]] = []
    worker.on("retry", seen.append)
    worker.on("start", seen.append)
    await worker.start()
    try:
        queue = worker.queue("jobs")
        await queue.enqueue_many(
            narrow, [{"id": f"{prefix}-f{n}", "fail_first": 9} for n in range(200)]
        )
        await until(lambda: sum(s["signal"] == "retry" for s in seen) == 200, "200 backing off")
        fresh = await queue.enqueue(narrow, {"id": f"{prefix}-fresh"})
        await until(lambda: DONE[f"{prefix}-fresh"] == 1, "the new job", timeout_s=5)
        [start] = [s for s in seen if s["signal"] == "start" and s["id"] == fresh]
        assert start["latency_ms"] < 1000, start
    finally:
        await worker.stop(5)


async def test_enqueue_many_and_bad_payloads(setup: Any, prefix: str) -> None:
    _, job, queue, _seen = setup
    ids = await queue.enqueue_many(job, [{"id": f"{prefix}-m{n}"} for n in range(20)])
    assert len(set(ids)) == 20
    await until(lambda: all(DONE[f"{prefix}-m{n}"] == 1 for n in range(20)), "all 20")
    with pytest.raises(JobError) as caught:
        await queue.enqueue(job, {"id": object()})
    assert caught.value.code == "job.invalid_payload"
    stats = await queue.stats(job)
    assert (stats.pending, stats.dlq) == (0, 0)


async def test_the_short_form_a_schema_and_a_plain_run_on_a_thread(setup: Any, prefix: str) -> None:
    ctx, _job, _queue, _seen = setup
    typed: type[Typed] = type("Typed", (Typed,), {"subject": f"{prefix}.typed"})
    worker = JobRunner(ctx)
    worker.register(typed)
    await worker.start()
    try:
        with pytest.raises(JobError) as caught:
            await typed.enqueue(ctx, {"id": f"{prefix}-bad", "sleep_s": "long"})
        assert caught.value.code == "job.invalid_payload"
        assert "sleep_s: Input should be a valid number" in caught.value.message
        # Three times its ack wait: the loop renews the lease while the thread sleeps.
        job_id = await typed.enqueue(ctx, Order(id=f"{prefix}-slow", sleep_s=1.8), id=prefix)
        again = await typed.enqueue(ctx, {"id": f"{prefix}-slow"}, id=prefix)
        assert (job_id, job_id.duplicate, again, again.duplicate) == (prefix, False, prefix, True)
        await until(lambda: DONE[f"{prefix}-slow"] == 1, "the slow run done")
        # A lost lease would have had it delivered again, and run, before the first run ended.
        await settled(lambda: worker.queue("jobs").stats(typed), "the queue")
        assert TYPED[f"{prefix}-slow"] == [(Order, False)]
        assert DONE[f"{prefix}-slow"] == 1
        stats = await worker.queue("jobs").stats(typed)
        assert (stats.pending, stats.dlq) == (0, 0)
    finally:
        await worker.stop(5)


async def test_a_timeout_fails_the_attempt_and_permanent_errors_skip_the_retries(
    setup: Any, prefix: str
) -> None:
    ctx, _job, _queue, _seen = setup
    limited: type[Limited] = type("Limited", (Limited,), {"subject": f"{prefix}.limited"})
    worker = JobRunner(ctx)
    worker.register(limited)
    seen: list[dict[str, Any]] = []
    for name in ("start", "retry", "fail", "dlq"):
        worker.on(name, seen.append)
    await worker.start()
    queue = worker.queue("jobs")
    try:
        modes = ("hang", "own_timeout", "permanent", "key")
        for mode in modes:
            await queue.enqueue(limited, {"id": f"{prefix}-{mode}", "mode": mode}, id=mode)
        await until(lambda: sum(s["signal"] == "dlq" for s in seen) == 4, "four dead letters")
        records = {r["id"]: r for r in await queue.dlq.list(limited)}
        ended = {
            mode: (records[mode]["error"]["type"], records[mode]["attempts"]) for mode in modes
        }
        assert ended == {
            "hang": ("JobTimeout", 2),
            "own_timeout": ("TimeoutError", 2),
            "permanent": ("Permanent", 1),
            "key": ("KeyError", 1),
        }
        assert [RUNS[f"{prefix}-{mode}"] for mode in modes] == [2, 2, 1, 1]
        assert "longer than its timeout_s (0.3 s)" in records["hang"]["error"]["message"]
        stats = await queue.stats(limited)
        assert (stats.pending, stats.in_flight, stats.dlq) == (0, 0, 4)
    finally:
        await worker.stop(5)


async def test_a_status_record_follows_each_job_and_result_answers(setup: Any, prefix: str) -> None:
    ctx, job, queue, _seen = setup
    tracked: type[Tracked] = type("Tracked", (Tracked,), {"subject": f"{prefix}.tracked"})
    idle: type[Tracked] = type(
        "Idle", (Tracked,), {"subject": f"{prefix}.idle"}
    )  # no worker consumes it
    before_ms = int(time.time() * 1000)
    queued = await idle.enqueue(ctx, {"id": f"{prefix}-q"})
    delayed = await idle.enqueue(ctx, {"id": f"{prefix}-d"}, delay=60)
    [status_q, status_d] = [await idle.status(ctx, i) for i in (queued, delayed)]
    assert status_q is not None and status_d is not None
    assert (status_q.state, status_q.attempts, status_q.job) == ("queued", 0, "Idle")
    assert status_q.enqueued_at is not None and status_q.enqueued_at >= before_ms
    assert status_d.state == "delayed" and status_d.due_at is not None
    assert status_d.due_at >= before_ms + 59_000
    assert await idle.status(ctx, "no-such-job") is None

    worker = JobRunner(ctx)
    worker.register(tracked)
    await worker.start()
    try:
        ok = await tracked.enqueue(ctx, {"id": f"{prefix}-ok", "returns": {"n": 7}})
        flaky = await tracked.enqueue(
            ctx, {"id": f"{prefix}-flaky", "fail_first": 1, "returns": [1, 2]}
        )
        failing = await tracked.enqueue(ctx, {"id": f"{prefix}-fail", "fail_first": 9})
        assert await tracked.result(ctx, ok, timeout_s=15) == {"n": 7}
        assert await tracked.result(ctx, flaky, timeout_s=15) == [1, 2]
        with pytest.raises(JobFailed) as caught:
            await tracked.result(ctx, failing, timeout_s=15)
        assert caught.value.code == "job.dead_lettered"
        assert "RuntimeError: planned failure 2" in caught.value.message

        done = await tracked.status(ctx, ok)
        assert done is not None
        assert (done.state, done.attempts, done.result_kept) == ("done", 1, True)
        assert done.worker == ctx.instance_id
        assert done.started_at is not None and done.finished_at is not None
        assert before_ms <= done.started_at <= done.finished_at
        assert done.history == ()
        retried = await tracked.status(ctx, flaky)
        assert retried is not None and (retried.state, retried.attempts) == ("done", 2)
        [first] = retried.history  # the attempt before the latest, under a key of its own
        assert (first.attempt, first.state, first.worker) == (1, "retrying", ctx.instance_id)
        assert first.error is not None and first.error.message == "planned failure 1"
        assert first.started_at is not None and retried.started_at is not None
        assert first.started_at <= retried.started_at
        dead = await tracked.status(ctx, failing)
        assert dead is not None and (dead.state, dead.attempts) == ("dlq", 2)
        assert dead.error is not None and dead.error.type == "RuntimeError"
        assert [(a.attempt, a.state) for a in dead.history] == [(1, "retrying")]
        with pytest.raises(TimeoutError):
            await tracked.result(ctx, "never-enqueued", timeout_s=0.2)
        with pytest.raises(JobError) as not_kept:
            await queue.result(job, ok, timeout_s=1)  # Contract keeps no results
        assert not_kept.value.code == "job.result_not_kept"
    finally:
        await worker.stop(5)


async def test_a_retry_hands_its_job_back_once_its_record_says_retrying(
    setup: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next attempt may run on another worker at once (a backoff of 0): were its records
    stored before this one's `retrying`, that late write would replace them (a `done` job read
    `retrying` for good). So the record is stored before the job is handed back."""
    ctx, _job, queue, _seen = setup
    tracked: type[Tracked] = type("Tracked", (Tracked,), {"subject": f"{prefix}.handback"})
    states_at_retry: list[str | None] = []

    def read_then(retry: Any) -> Any:
        async def read_then_retry(delivery: Any, **kwargs: Any) -> None:
            status = await queue.status(tracked, delivery.id)
            states_at_retry.append(None if status is None else status.state)
            await retry(delivery, **kwargs)

        return read_then_retry

    wrap_receivers(monkeypatch, ctx.bus("jobs"), {"retry": read_then})
    async with running(ctx, tracked):
        flaky = await tracked.enqueue(
            ctx, {"id": f"{prefix}-handback", "fail_first": 1, "returns": 2}
        )
        assert await tracked.result(ctx, flaky, timeout_s=15) == 2
    assert states_at_retry == ["retrying"]


async def test_a_job_whose_dead_letter_was_not_stored_is_handed_back_once_its_record_says_failed(
    setup: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a job handed back because its DLQ record could not be stored: its
    `failed` record is stored first, and the next delivery stores the dead letter and `dlq`."""
    ctx, _job, queue, _seen = setup
    doomed: type[Tracked] = type(
        "Doomed", (Tracked,), {"subject": f"{prefix}.doomed", "retries": 0}
    )
    states_at_release: list[str | None] = []
    refused: list[str] = []

    def refuse_once(dead_letter: Any) -> Any:
        async def refusing(delivery: Any, *args: Any, **kwargs: Any) -> None:
            if not refused:
                refused.append(delivery.id)
                raise DriverUnavailable("the DLQ store is away (planned)")
            await dead_letter(delivery, *args, **kwargs)

        return refusing

    def read_then(release: Any) -> Any:
        async def read_then_release(delivery: Any, **kwargs: Any) -> None:
            status = await queue.status(doomed, delivery.id)
            states_at_release.append(None if status is None else status.state)
            await release(delivery, **kwargs)

        return read_then_release

    wraps = {"dead_letter": refuse_once, "release": read_then}
    wrap_receivers(monkeypatch, ctx.bus("jobs"), wraps)
    worker = JobRunner(ctx)
    worker.register(doomed)
    worker.queue("jobs").dlq_retry_delay_s = 0.1
    await worker.start()
    try:
        job_id = await doomed.enqueue(ctx, {"id": f"{prefix}-doomed", "fail_first": 1})
        await until(lambda: status_is(queue, doomed, job_id, "dlq"), "the dead letter stored", 20)
    finally:
        await worker.stop(5)
    assert states_at_release == ["failed"]
    assert RUNS[f"{prefix}-doomed"] == 1  # handed back to be dead-lettered, never run again
    [record] = await queue.dlq.list(doomed)
    assert (record["id"], record["attempts"]) == (job_id, 1)


async def test_a_jobs_last_record_is_stored_before_its_delivery_is_settled(
    setup: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed just after a settle must leave the job's last record stored: a job
    acked while its `done` waited to be sent would say `running` for good. So each settle
    comes after the record: `done` before the ack, `cancelled` before a cancel's ack, and
    `failed` before the dead letter (its `dlq` after; a worker killed in between, here a
    `dlq` record the bus never gets, leaves `failed`, which a read shows `dlq` once it finds
    the dead letter and the `failed` is older than FAILED_GRACE_S, 0.5 s here)."""
    monkeypatch.setattr(records_module, "FAILED_GRACE_S", 0.5)
    ctx, _job, queue, _seen = setup
    tracked: type[Tracked] = type(
        "Tracked", (Tracked,), {"subject": f"{prefix}.settle", "retries": 0}
    )
    slow: type[Slow] = type("Slow", (Slow,), {"subject": f"{prefix}.settleslow"})
    bus = ctx.bus("jobs")
    make_receiver, put_records = bus.receiver, bus.put_records
    at_settle: list[tuple[str, str, str | None]] = []

    def receiver(lane: Any, *, consumer: str) -> Any:
        made = make_receiver(lane, consumer=consumer)
        job = {tracked.__name__: tracked, slow.__name__: slow}[lane.name]
        ack, dead_letter = made.ack, made.dead_letter

        async def read(settle: str, delivery: Any) -> None:
            status = await queue.status(job, delivery.id)
            at_settle.append((settle, delivery.id, None if status is None else status.state))

        async def read_then_ack(delivery: Any) -> None:
            await read("ack", delivery)
            await ack(delivery)

        async def read_then_dead_letter(delivery: Any, *args: Any, **kwargs: Any) -> None:
            await read("dead_letter", delivery)
            await dead_letter(delivery, *args, **kwargs)

        monkeypatch.setattr(made, "ack", read_then_ack)
        monkeypatch.setattr(made, "dead_letter", read_then_dead_letter)
        return made

    async def lose_dlq_records(lane: Any, table: str, records: Any, **kwargs: Any) -> Any:
        kept = [(key, raw) for key, raw in records if b'"state":"dlq"' not in raw]
        return await put_records(lane, table, kept, **kwargs)

    monkeypatch.setattr(bus, "receiver", receiver)
    monkeypatch.setattr(bus, "put_records", lose_dlq_records)
    worker = JobRunner(ctx)
    worker.register(tracked)
    worker.register(slow)
    await worker.start()
    try:
        done = await tracked.enqueue(ctx, {"id": f"{prefix}-settle-done", "returns": 7})
        assert await tracked.result(ctx, done, timeout_s=15) == 7
        failed = await tracked.enqueue(ctx, {"id": f"{prefix}-settle-dlq", "fail_first": 1})
        await until(lambda: queue.dlq.get(tracked, failed), "the dead letter stored")
        running = await slow.enqueue(ctx, {"id": f"{prefix}-settle-cancel", "sleep_s": 30})
        await until(lambda: state_of(slow, ctx, running, "running"), "the slow job running")
        assert await slow.cancel(ctx, running) == Cancelled(True, "cancelled")
        await until(lambda: len(at_settle) == 3, "three settles")
    finally:
        await worker.stop(5)
    assert at_settle == [
        ("ack", done, "done"),
        ("dead_letter", failed, "failed"),
        ("ack", running, "cancelled"),
    ]
    await until(lambda: status_is(queue, tracked, failed, "dlq"), "shown dlq after the grace")
    status = await queue.status(tracked, failed)
    assert status is not None and (status.state, status.attempts) == ("dlq", 1)
    with pytest.raises(JobFailed) as raised:
        await tracked.result(ctx, failed, timeout_s=5)
    assert raised.value.code == "job.dead_lettered"


class Slow(Job):
    """Sleeps `sleep_s`; counts its starts (RUNS), its ends (DONE) and its cancels."""

    bus = "jobs"
    concurrency = 2
    retries = 3
    backoff = {"type": "exponential", "initial": 10, "max": 10}

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        RUNS[payload["id"]] += 1
        try:
            await asyncio.sleep(payload.get("sleep_s", 0))
        except asyncio.CancelledError:
            CANCELLED[payload["id"]] += 1
            raise
        DONE[payload["id"]] += 1


CANCELLED: Counter[str] = Counter()


async def status_is(queue: JobQueue, job: type[Job], job_id: str, state: str) -> bool:
    status = await queue.status(job, job_id)
    return status is not None and status.state == state


async def state_of(job: type[Job], ctx: Context, job_id: str, state: str) -> bool:
    status = await job.status(ctx, job_id)
    return status is not None and status.state == state


async def test_cancel_a_queued_a_delayed_a_running_and_a_finished_job(
    setup: Any, prefix: str
) -> None:
    ctx, _job, _queue, _seen = setup
    slow: type[Slow] = type("Slow", (Slow,), {"subject": f"{prefix}.slow"})
    queue = JobQueue(ctx, "jobs")
    # Before any worker: one queued, one delayed, both cancelled.
    queued = await slow.enqueue(ctx, {"id": f"{prefix}-queued"})
    delayed = await slow.enqueue(ctx, {"id": f"{prefix}-delayed"}, delay=0.5)
    for job_id in (queued, delayed):
        assert await slow.cancel(ctx, job_id) == Cancelled(True, "cancelled")
    worker = JobRunner(ctx)
    worker.register(slow)
    seen: list[dict[str, Any]] = []
    for name in ("start", "done", "cancel", "retry"):
        worker.on(name, seen.append)
    await worker.start()
    try:
        running = await slow.enqueue(ctx, {"id": f"{prefix}-running", "sleep_s": 30})
        quick = await slow.enqueue(ctx, {"id": f"{prefix}-quick"})
        await until(lambda: RUNS[f"{prefix}-running"] == 1, "the long job started")
        # Finished is what its record says (a worker sends it a moment after the run).
        await until(lambda: state_of(slow, ctx, quick, "done"), "the quick job's record done")
        assert await queue.cancel(slow, running) == Cancelled(True, "cancelled")
        await until(lambda: CANCELLED[f"{prefix}-running"] == 1, "the running job cancelled")
        assert await queue.cancel(slow, quick) == Cancelled(False, "done")
        # The queued and the delayed ones come up and are skipped; nothing runs them.
        await until(lambda: sum(s["signal"] == "cancel" for s in seen) == 3, "three cancels")
        await settled(lambda: queue.stats(slow), "the queue")  # nothing left to run or retry
        assert [RUNS[f"{prefix}-{n}"] for n in ("queued", "delayed", "running", "quick")] == [
            0,
            0,
            1,
            1,
        ]
        assert not [s for s in seen if s["signal"] == "retry"]
        statuses = {i: await slow.status(ctx, i) for i in (queued, delayed, running, quick)}
        assert {i: s.state for i, s in statuses.items() if s} == {
            queued: "cancelled",
            delayed: "cancelled",
            running: "cancelled",
            quick: "done",
        }
        # Runs made: none for the two that never started ("cancelled before it ran").
        assert {i: s.attempts for i, s in statuses.items() if s} == {
            queued: 0,
            delayed: 0,
            running: 1,
            quick: 1,
        }
        assert await queue.cancel(slow, running) == Cancelled(False, "cancelled")
        stats = await queue.stats(slow)
        assert (stats.pending, stats.in_flight, stats.dlq) == (0, 0, 0)
    finally:
        await worker.stop(5)


def pause_seen(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether a consume loop logged that it saw its lane paused (it reads the pause every
    second: mega.lanes.control.WATCH_S)."""
    return "paused: running jobs finish" in caplog.text


async def test_a_paused_queue_starts_nothing_until_it_is_resumed(
    setup: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    ctx, _job, _queue, _seen = setup
    caplog.set_level(logging.INFO, logger="mega.jobqueue")
    slow: type[Slow] = type("Slow", (Slow,), {"subject": f"{prefix}.paused"})
    queue = JobQueue(ctx, "jobs")
    worker = JobRunner(ctx)
    worker.register(slow)
    await worker.start()
    try:
        await slow.enqueue(ctx, {"id": f"{prefix}-long", "sleep_s": 1.5})
        await until(lambda: RUNS[f"{prefix}-long"] == 1, "the long job started")
        pause = await queue.pause(slow, by="test")
        assert (pause.paused, pause.by) == (True, "test")
        assert (await queue.paused(slow)).paused
        await until(lambda: pause_seen(caplog), "the worker saw the pause")
        for n in range(3):
            await slow.enqueue(ctx, {"id": f"{prefix}-p{n}"})
        await until(lambda: DONE[f"{prefix}-long"] == 1, "the running job finished")
        # Each freed slot fetches a paused job and holds it, its lease renewed: once every
        # slot holds one, nothing more is fetched and nothing starts until the resume.
        slots = slow.concurrency
        stats = await settled(lambda: queue.stats(slow), "held", pending=3 - slots, in_flight=slots)
        assert sum(RUNS[f"{prefix}-p{n}"] for n in range(3)) == 0  # nothing new started
        assert stats.dlq == 0
        await queue.resume(slow, by="test")
        await until(lambda: all(DONE[f"{prefix}-p{n}"] == 1 for n in range(3)), "resumed")
        assert not (await queue.paused(slow)).paused
    finally:
        await worker.stop(5)


async def test_a_pause_outlives_the_keep_of_the_status_records_while_a_worker_runs(
    setup: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    ctx, _job, _queue, _seen = setup
    caplog.set_level(logging.INFO, logger="mega.jobqueue")
    # Records kept 4 s: the pause record would expire 4 s after its write, were it not kept.
    short: type[Slow] = type("Short", (Slow,), {"subject": f"{prefix}.short", "keep_status_s": 4})
    queue = JobQueue(ctx, "jobs")
    worker = JobRunner(ctx)
    worker.register(short)
    await worker.start()
    try:
        lane = job_lane(await queue.ensure(short))
        paused = await queue.pause(short, by="test")
        assert paused.at_ms is not None
        first_keep_ends_ms = paused.at_ms + 4_000
        await until(lambda: pause_seen(caplog), "the worker saw the pause")
        await short.enqueue(ctx, {"id": f"{prefix}-held"})

        async def kept_past_its_first_keep() -> bool:
            """The worker wrote the record again at or after the time its first write expired
            (the server's TTL: real time passes here, about 4 s)."""
            [raw] = await queue.bus.get_records(lane, "status", [PAUSE_KEY])
            kept_at = 0 if raw is None else json.loads(raw).get("kept_at", 0)
            return kept_at >= first_keep_ends_ms

        await until(kept_past_its_first_keep, "the pause record kept past its first keep")
        assert (await queue.paused(short)).paused
        assert RUNS[f"{prefix}-held"] == 0
        await queue.resume(short, by="test")
        await until(lambda: DONE[f"{prefix}-held"] == 1, "run once resumed")
    finally:
        await worker.stop(5)


async def test_stats_say_when_the_oldest_waiting_job_came_and_count_what_was_stored(
    setup: Any, prefix: str
) -> None:
    ctx, _job, _queue, _seen = setup
    counted: type[Contract] = type("Counted", (Contract,), {"subject": f"{prefix}.counted"})
    queue = JobQueue(ctx, "jobs")
    before = await queue.stats(counted)
    assert (before.pending, before.in_flight, before.oldest_ms) == (0, 0, None)
    ids = []
    for n in range(3):  # no worker yet: they wait, each enqueued a few ms after the last
        ids.append(await queue.enqueue(counted, {"id": f"{prefix}-c{n}"}))
        await asyncio.sleep(0.005)
    first = await queue.status(counted, ids[0])
    assert first is not None and first.enqueued_at is not None
    stats = await queue.stats(counted)
    assert (stats.pending, stats.in_flight) == (3, 0)
    assert stats.oldest_ms is not None and abs(stats.oldest_ms - first.enqueued_at) <= 1
    assert stats.stored - before.stored == 3
    worker = JobRunner(ctx)
    worker.register(counted)
    await worker.start()
    try:
        await until(lambda: all(DONE[f"{prefix}-c{n}"] == 1 for n in range(3)), "all 3 run")

        async def settled() -> bool:
            now = await queue.stats(counted)
            return (now.pending, now.in_flight, now.oldest_ms) == (0, 0, None)

        await until(settled, "nothing left unsettled")
        assert (await queue.stats(counted)).stored - before.stored == 3
    finally:
        await worker.stop(5)


class Doomed(Job):
    """Fails at once, for good: each job is one dead letter."""

    bus = "jobs"
    retries = 0
    concurrency = 50

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        raise Permanent(f"doomed {payload['n']}")


async def test_dead_letters_page_newest_first_and_are_found_and_deleted_by_id(
    setup: Any, prefix: str
) -> None:
    ctx, _job, _queue, _seen = setup
    doomed: type[Doomed] = type("Doomed", (Doomed,), {"subject": f"{prefix}.doomed"})
    worker = JobRunner(ctx)
    worker.register(doomed)
    await worker.start()
    queue = worker.queue("jobs")
    try:
        ids = await queue.enqueue_many(doomed, [{"n": n} for n in range(250)])
        await until(lambda: count_is(queue, doomed, 250), "250 dead letters", timeout_s=60)
    finally:
        await worker.stop(5)
    pages: list[list[DlqRecord]] = []
    before = None
    while page := await queue.dlq.list(doomed, limit=100, before=before):
        pages.append(page)
        before = page[-1]["seq"]
    assert [len(page) for page in pages] == [100, 100, 50]
    seqs = [record["seq"] for page in pages for record in page]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == 250  # newest first, once
    assert sorted(record["id"] for page in pages for record in page) == sorted(ids)
    assert await queue.dlq.list(doomed, limit=100, before=seqs[-1]) == []

    some = pages[1][7]
    found = await queue.dlq.get(doomed, some["id"])
    assert found is not None and (found["seq"], found["payload"]) == (some["seq"], some["payload"])
    assert found["error"] == {"type": "Permanent", "message": f"doomed {some['payload']['n']}"}
    assert await queue.dlq.get(doomed, "no-such-job") is None
    assert await queue.dlq.delete(doomed, some["id"]) is True
    assert await queue.dlq.get(doomed, some["id"]) is None
    assert await queue.dlq.delete(doomed, some["id"]) is False
    assert await queue.dlq.count(doomed) == 249
    remaining = await queue.dlq.list(doomed, limit=300)
    assert [r["seq"] for r in remaining] == [seq for seq in seqs if seq != some["seq"]]


async def count_is(queue: JobQueue, job: type[Job], count: int) -> bool:
    return await queue.dlq.count(job) == count


async def test_a_running_consume_loop_is_seen_and_says_when_it_stopped(
    setup: Any, prefix: str
) -> None:
    ctx, _job, _queue, _seen = setup
    watched: type[Contract] = type("Watched", (Contract,), {"subject": f"{prefix}.watched"})
    queue = JobQueue(ctx, "jobs")
    assert await queue.workers(watched) == []
    started_ms = int(time.time() * 1000)
    worker = JobRunner(ctx, instance_id=f"{prefix}-w1")
    worker.register(watched)
    await worker.start()
    try:

        async def seen() -> bool:
            return [w.worker for w in await queue.workers(watched)] == [f"{prefix}-w1"]

        await until(seen, "the running loop seen")
        [running] = await queue.workers(watched)
        assert running.stopped_at is None and running.running == 0
        assert started_ms <= running.started_at <= running.seen_at
        await queue.enqueue(watched, {"id": f"{prefix}-w"})
        await until(lambda: DONE[f"{prefix}-w"] == 1, "the job run")
    finally:
        await worker.stop(5)
    [stopped] = await queue.workers(watched)  # its last write, at the stop
    assert (stopped.worker, stopped.running, stopped.done) == (f"{prefix}-w1", 0, 1)
    assert stopped.stopped_at is not None and stopped.stopped_at >= running.seen_at


async def test_stop_drains_running_jobs(setup: Any, prefix: str) -> None:
    _ctx, job, queue, _seen = setup
    await queue.enqueue(job, {"id": f"{prefix}-slow", "sleep_s": 0.5})
    await until(lambda: RUNS[f"{prefix}-slow"] == 1, "started")
    await queue.stop(5)  # waits for the running job
    assert DONE[f"{prefix}-slow"] == 1


async def test_a_memory_bus_says_so_at_start(
    tmp_path: Path, nats_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(
        write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=MEMORY_BUS)
    )
    ctx = await boot(config, role="test", database=False)
    try:
        assert ctx.bus("jobs").driver == "memory"
        assert "bus 'jobs' is in memory: its jobs and events live and die" in caplog.text
    finally:
        await shutdown(ctx)


STARTED: dict[str, list[tuple[float, str]]] = {}  # subject -> (start time, worker), each run


@contextlib.asynccontextmanager
async def consume_loops(ctx: Context, job: type[Job], prefix: str, n: int) -> AsyncIterator[None]:
    """`n` consume loops of `job` (n workers' worth), each its own JobRunner, stopped after."""
    workers = [JobRunner(ctx, instance_id=f"{prefix}-w{i}") for i in range(n)]
    try:
        for worker in workers:
            worker.register(job)
            await worker.start()
        yield
    finally:
        for worker in workers:
            await worker.stop(5)


class Throttled(Job):
    """Counts its starts and where they ran; `rate_limit` caps them for the whole group."""

    bus = "jobs"
    concurrency = 50
    rate_limit = {"limit": 10, "period_s": 1.0}

    async def run(self, payload: int, ctx: JobContext) -> None:
        STARTED.setdefault(self.subject, []).append((time.time(), ctx.worker))
        RUNS[f"{self.subject}:{payload}"] += 1


async def test_a_rate_limit_caps_the_starts_of_the_whole_group(setup: Any, prefix: str) -> None:
    """Three consume loops of one job (three workers' worth), a limit of 10 a second, 40 jobs:
    no one-second window holds more than 10 starts, whichever loops start them, every job runs
    once, and what the limit holds back keeps its attempt."""
    ctx, _, queue, _ = setup
    job: type[Throttled] = type("Throttled", (Throttled,), {"subject": f"{prefix}.throttled"})
    ids = await queue.enqueue_many(job, range(40))
    async with consume_loops(ctx, job, prefix, 3):
        started = STARTED.setdefault(job.subject, [])
        await until(lambda: len(started) >= 40, f"all 40 started: {started}", 15)
        await asyncio.sleep(0.3)
        starts = STARTED[job.subject]
        assert sorted(RUNS[f"{job.subject}:{n}"] for n in range(40)) == [1] * 40
        assert len(starts) == 40
        per_second = Counter(int(at) for at, _ in starts)
        assert max(per_second.values()) <= 10, per_second
        times = sorted(at for at, _ in starts)
        assert times[-1] - times[0] >= 3.0  # 40 starts at 10 a second: at least 3 s apart
        held = await queue.status(job, ids[-1])  # held back the longest: still one attempt
        assert held is not None and (held.state, held.attempts) == ("done", 1)


KEYS_SEEN: dict[str, list[str | None]] = {}  # payload id -> ctx.key of each run


class Keyed(Contract):
    """Contract's job, recording the key each run was enqueued with."""

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
        KEYS_SEEN.setdefault(payload["id"], []).append(ctx.key)
        await super().run(payload, ctx)


async def test_a_key_travels_with_its_job_through_retries_a_delay_and_a_requeue(
    setup: Any, prefix: str
) -> None:
    """The key given on enqueue reaches every run (a retry's copy keeps it), a delayed job's
    and a dead letter's (its record names it, and a requeue keeps it); a job without one sees
    None; a bad key is refused before anything is stored."""
    ctx, _, queue, _ = setup
    job: type[Keyed] = type("Keyed", (Keyed,), {"subject": f"{prefix}.keyed"})
    async with consume_loops(ctx, job, prefix, 1):
        failing, later, plain = f"{prefix}-fails", f"{prefix}-later", f"{prefix}-plain"
        failing_id = await queue.enqueue(job, {"id": failing, "fail_first": 3}, key="tenant-a")
        await queue.enqueue(job, {"id": later}, key="tenant-b", delay=0.3)
        await queue.enqueue(job, {"id": plain})
        with pytest.raises(JobError) as raised:
            await queue.enqueue(job, {"id": f"{prefix}-bad"}, key="two words")
        assert raised.value.code == "job.invalid_key"
        await until(lambda: queue.dlq.count(job), "the failing job dead-lettered")
        [record] = await queue.dlq.list(job)
        assert (record["id"], record.get("flow_key")) == (failing_id, "tenant-a")
        assert await queue.dlq.requeue(job, failing_id) == 1
        await until(lambda: DONE[failing] == 1, "the requeued run done")
        await until(lambda: DONE[later] == 1 and DONE[plain] == 1, "the others done")
        assert KEYS_SEEN[failing] == ["tenant-a"] * 4  # three attempts, then the requeued run
        assert KEYS_SEEN[later] == ["tenant-b"]
        assert KEYS_SEEN[plain] == [None]
        assert f"{prefix}-bad" not in KEYS_SEEN


class PerKey(Throttled):
    """Throttled, with its limit counted for each key: 5 starts a second per key."""

    rate_limit = {"limit": 5, "period_s": 1.0, "per": "key"}


async def test_a_rate_limit_per_key_caps_each_key_alone(setup: Any, prefix: str) -> None:
    """Two consume loops, 5 starts a second per key: 15 jobs of key "big" take three windows,
    while the 3 of key "small", enqueued after them, start in the first; each key's starts
    never exceed 5 in any second, and a job held back keeps its attempt."""
    ctx, _, queue, _ = setup
    job: type[PerKey] = type("PerKey", (PerKey,), {"subject": f"{prefix}.perkey"})
    big = await queue.enqueue_many(job, range(15), key="big")
    small = await queue.enqueue_many(job, range(15, 18), key="small")
    async with consume_loops(ctx, job, prefix, 2):
        started = STARTED.setdefault(job.subject, [])
        await until(lambda: len(started) >= 18, f"all 18 started: {started}", 15)
        await asyncio.sleep(0.3)
        assert sorted(RUNS[f"{job.subject}:{n}"] for n in range(18)) == [1] * 18
        for ids in (big, small):
            statuses = [await queue.status(job, job_id) for job_id in ids]
            assert [(s.state, s.attempts) for s in statuses if s] == [("done", 1)] * len(ids)
        times = {
            key: sorted(s.started_at for s in [await queue.status(job, i) for i in ids] if s)
            for key, ids in (("big", big), ("small", small))
        }
        first = min(times["big"][0], times["small"][0])
        # Any six starts of one key span a second (ms of the status records; 50 ms of slack for
        # the stamp taken after the run began).
        assert all(
            later - earlier >= 950
            for earlier, later in zip(times["big"], times["big"][5:], strict=False)
        )
        assert times["big"][-1] - first >= 1900  # 15 starts at 5 a second: three windows
        assert times["small"][-1] - first < 1000  # not behind big's backlog


RUNNING_NOW: Counter[str] = Counter()  # key -> runs going on now
MOST_AT_ONCE: Counter[str] = Counter()  # key -> the most runs at once
ENDED: dict[str, list[float]] = {}  # key -> when each run ended


class Capped(Job):
    """Runs of 100 ms, at most 2 of one key at once across the group."""

    bus = "jobs"
    concurrency = 8
    key_concurrency = 2

    async def run(self, payload: int, ctx: JobContext) -> None:
        key = f"{self.subject}:{ctx.key}"
        RUNNING_NOW[key] += 1
        MOST_AT_ONCE[key] = max(MOST_AT_ONCE[key], RUNNING_NOW[key])
        await asyncio.sleep(0.1)
        RUNNING_NOW[key] -= 1
        ENDED.setdefault(key, []).append(time.monotonic())


async def test_key_concurrency_caps_the_runs_of_one_key_across_the_group(
    setup: Any, prefix: str, redis_url: str
) -> None:
    """Two consume loops of 8 slots each, key_concurrency 2: key "a"'s 12 jobs never run more
    than 2 at once, and key "b"'s 4, enqueued after them, are not held behind them; every job
    runs once, a held one keeps its attempt, and no lease is left in the cache."""
    ctx, _, queue, _ = setup
    job: type[Capped] = type("Capped", (Capped,), {"subject": f"{prefix}.capped"})
    a = await queue.enqueue_many(job, range(12), key="a")
    b = await queue.enqueue_many(job, range(4), key="b")
    async with consume_loops(ctx, job, prefix, 2):
        ended_a, ended_b = (ENDED.setdefault(f"{job.subject}:{key}", []) for key in "ab")
        await until(lambda: len(ended_a) == 12 and len(ended_b) == 4, "all 16 ended", 20)
        assert MOST_AT_ONCE[f"{job.subject}:a"] == 2
        assert MOST_AT_ONCE[f"{job.subject}:b"] == 2
        assert max(ended_b) < max(ended_a)  # b's four were not left behind a's twelve

        async def all_done_at_once() -> bool:
            statuses = [await queue.status(job, job_id) for job_id in [*a, *b]]
            return [(s.state, s.attempts) for s in statuses if s] == [("done", 1)] * 16

        await until(all_done_at_once, "each done in one attempt", 5)
        redis, lane = ctx.cache("main").native, f"job:{job.name}:{job.subject}"

        async def no_leases() -> bool:
            leases: int = sum([await redis.zcard(f"mega:slots:{lane}:{key}") for key in "ab"])
            return leases == 0

        await until(no_leases, "every lease dropped", 5)


STARTS: dict[str, list[str | None]] = {}  # subject -> the key of each start, in order


class Shared(Job):
    """Runs of 20 ms, two at once; records the key of each start."""

    bus = "jobs"
    concurrency = 2

    async def run(self, payload: int, ctx: JobContext) -> None:
        STARTS.setdefault(self.subject, []).append(ctx.key)
        await asyncio.sleep(0.02)


async def started_after(
    ctx: Context, queue: JobQueue, job: type[Job], prefix: str, *, flood: int
) -> int:
    """How many of key "big"'s `flood` jobs, enqueued first, start before key "small"'s one."""
    await queue.enqueue_many(job, range(flood), key="big")
    await queue.enqueue(job, flood, key="small")
    starts = STARTS.setdefault(job.subject, [])
    async with consume_loops(ctx, job, prefix, 1):
        await until(lambda: "small" in starts, "small's job started", 30)
    return starts.index("small")


async def test_a_fair_job_takes_turns_across_keys(setup: Any, prefix: str) -> None:
    """Key "big" floods the queue, then key "small" adds one job. In order (fair off), small
    starts after the whole flood; with fair = True, among the first `concurrency` + 1 starts
    (the first turns)."""
    ctx, _, queue, _ = setup
    in_order: type[Shared] = type("Shared", (Shared,), {"subject": f"{prefix}.inorder"})
    assert await started_after(ctx, queue, in_order, prefix, flood=30) == 30
    fair: type[Shared] = type("Shared", (Shared,), {"subject": f"{prefix}.fair", "fair": True})
    assert await started_after(ctx, queue, fair, prefix, flood=300) <= Shared.concurrency


@pytest.mark.parametrize(
    ("capability", "declared", "code"),
    [
        ("fair_lanes", "fair", "job.fair_unsupported"),
        ("priority_lanes", "prioritized", "job.priority_unsupported"),
    ],
)
async def test_a_driver_that_cannot_take_turns_refuses_a_fair_or_prioritized_job(
    setup: Any,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capability: str,
    declared: str,
    code: str,
) -> None:
    """A bus whose driver says it cannot consume a fair (or a prioritized) lane, a plugin's
    say, refuses such a job at enqueue (and so at a worker's start) with a sentence, and
    stores nothing."""
    _, _, queue, _ = setup
    monkeypatch.setattr(queue.bus, capability, False)
    refused: type[Shared] = type(
        "Shared", (Shared,), {"subject": f"{prefix}.refused", declared: True}
    )
    with pytest.raises(JobError) as raised:
        await queue.enqueue(refused, 1)
    assert raised.value.code == code
    assert f"bus 'jobs' is {queue.bus.driver}" in str(raised.value)


class Ranked(Job):
    """Runs of 5 ms, one at once; records the band (its payload) of each start."""

    bus = "jobs"
    concurrency = 1
    prioritized = True

    async def run(self, payload: str, ctx: Context) -> None:
        STARTS.setdefault(self.subject, []).append(payload)
        await asyncio.sleep(0.005)


async def test_a_prioritized_job_takes_high_first_and_never_starves_low(
    setup: Any, prefix: str
) -> None:
    """5 low jobs, then 20 normal, then a flood of 100 high, all waiting before the worker
    starts. While every band has jobs, each 10 starts are 6 high, 3 normal and 1 low: high
    goes first, and low still moves inside the flood instead of after it."""
    ctx, _, queue, _ = setup
    job: type[Ranked] = type("Ranked", (Ranked,), {"subject": f"{prefix}.ranked"})
    for band, count in (("low", 5), ("normal", 20), ("high", 100)):
        await queue.enqueue_many(job, [band] * count, priority=band)
    starts = STARTS.setdefault(job.subject, [])
    async with consume_loops(ctx, job, prefix, 1):
        await until(lambda: len(starts) == 125, "all 125 started", 60)
    first = Counter(starts[:50])
    assert 27 <= first["high"] <= 31 and 13 <= first["normal"] <= 17, starts
    assert first["low"] >= 4, starts  # low moved while 70 high were still waiting
    assert starts[:5].count("high") >= 2, starts


async def test_a_priority_is_a_band_of_a_prioritized_job(setup: Any, prefix: str) -> None:
    """A priority that is not a band, or given to a job that is not prioritized, is refused
    with a sentence naming the fix, and nothing is stored."""
    _, _, queue, _ = setup
    ranked: type[Ranked] = type("Ranked", (Ranked,), {"subject": f"{prefix}.badband"})
    plain: type[Shared] = type("Shared", (Shared,), {"subject": f"{prefix}.unranked"})
    with pytest.raises(JobError) as raised:
        await queue.enqueue(ranked, "x", priority="urgent")
    assert raised.value.code == "job.invalid_priority"
    assert "priority must be one of high, normal, low, got 'urgent'" in str(raised.value)
    with pytest.raises(JobError) as raised:
        await queue.enqueue(plain, 1, priority="high")
    assert raised.value.code == "job.invalid_priority"
    assert "set prioritized = True on it" in str(raised.value)
    assert (await queue.stats(ranked)).pending == 0
    assert (await queue.stats(plain)).pending == 0


class FailsOnce(Job):
    """Fails its first run (no retries: a dead letter at once), runs through after."""

    bus = "jobs"
    retries = 0

    async def run(self, payload: str, ctx: Context) -> None:
        RUNS[payload] += 1
        if RUNS[payload] == 1:
            raise RuntimeError("first run")
        DONE[payload] += 1


@pytest.mark.parametrize("declared", ["fair", "prioritized"])
async def test_a_dead_letter_of_a_fair_or_prioritized_job_runs_again_when_requeued(
    setup: Any, prefix: str, declared: str
) -> None:
    """A dead letter requeued joins the queue of a job that takes turns like any other's."""
    ctx, _, queue, _ = setup
    job: type[FailsOnce] = type(
        "FailsOnce", (FailsOnce,), {"subject": f"{prefix}.{declared}", declared: True}
    )
    key = f"{prefix}-{declared}"
    enqueue_as = {"key": "tenant"} if declared == "fair" else {"priority": "high"}
    await queue.enqueue(job, key, id=key, **enqueue_as)
    async with consume_loops(ctx, job, prefix, 1):
        await until(lambda: RUNS[key] == 1, "the first run")
        await until(lambda: queue.dlq.count(job), "its dead letter")
        assert await queue.dlq.requeue(job, key) == 1
        await until(lambda: DONE[key] == 1, "the requeued run")
    assert RUNS[key] == 2 and await queue.dlq.count(job) == 0


async def test_a_poison_job_costs_one_delivery_never_the_lane(setup: Any, prefix: str) -> None:
    """Jobs whose id or key no check let through (5,000 characters, published straight into
    the engine, as an older or foreign producer could): each is dead-lettered with a record
    that says why and never run, and the lane goes on (the next 100 jobs all run)."""
    _, job, queue, seen = setup
    spec = await queue.ensure(job)
    long_id, now_ms = "p" * 5000, int(time.time() * 1000)
    poison = [
        Message(long_id, spec.subject, b'{"id": "poison"}', now_ms),
        Message(
            f"{prefix}-long-key", spec.subject, b'{"id": "poison"}', now_ms, flow_key="k" * 5000
        ),
    ]
    await queue.bus.publish(job_lane(spec), poison)
    for n in range(100):
        await queue.enqueue(job, {"id": f"{prefix}-{n}"})
    await until(lambda: all(DONE[f"{prefix}-{n}"] == 1 for n in range(100)), "100 jobs", 30)
    await until(lambda: queue.dlq.count(job), "the poison dead-lettered", 30)
    await until(lambda: len([s for s in seen if s["signal"] == "dlq"]) == 2, "two dlq signals")
    records = {record["id"]: record for record in await queue.dlq.list(job)}
    assert set(records) == {stand_in_id(long_id), f"{prefix}-long-key"}
    assert RUNS["poison"] == 0
    for record, what in (
        (records[stand_in_id(long_id)], "id"),
        (records[f"{prefix}-long-key"], "key"),
    ):
        assert record["error"]["type"] == "InvalidId" and record["attempts"] == 0
        assert f"its {what} is not 1-200 printable" in record["error"]["message"]
        assert "(5,000 characters)" in record["error"]["message"]
    status = await queue.status(job, stand_in_id(long_id))
    assert status is not None and status.state == "dlq"


async def test_a_payload_over_a_cap_is_refused_before_anything_is_stored(
    setup: Any, prefix: str
) -> None:
    """Over the class's max_payload_bytes (1 MiB by default) on every driver; over what the
    engine takes (a NATS server's max_payload, 1 MB here) where that is less: the same
    `job.payload_too_large`, never a 503, and no job nor record stored."""
    _, job, queue, _ = setup
    with pytest.raises(JobError) as caught:
        await queue.enqueue(job, {"id": "big", "pad": "x" * 1024 * 1024}, id=f"{prefix}-big")
    assert caught.value.code == "job.payload_too_large"
    assert "over its max_payload_bytes (1,048,576)" in str(caught.value)
    with pytest.raises(JobError):
        await queue.enqueue_many(job, [{"id": "small"}, {"id": "big", "pad": "x" * 1024 * 1024}])
    roomy = type("Roomy", (job,), {"max_payload_bytes": 4 * 1024 * 1024})
    payload = {"id": f"{prefix}-roomy", "pad": "x" * 1536 * 1024}
    if queue.bus.driver == "nats":
        with pytest.raises(JobError) as engine:
            await queue.enqueue(roomy, payload, id=f"{prefix}-roomy")
        assert engine.value.code == "job.payload_too_large"
        assert "over what its bus's server takes (max_payload less its headers" in str(engine.value)
        assert await queue.status(roomy, f"{prefix}-roomy") is None
    else:
        await queue.enqueue(roomy, payload, id=f"{prefix}-roomy")
        await until(lambda: DONE[f"{prefix}-roomy"] == 1, "the roomy job ran")
    assert await queue.status(job, f"{prefix}-big") is None
    assert (await queue.stats(job)).pending == 0  # nothing of either call was stored


async def test_a_dead_letter_over_the_engines_cap_is_kept_without_its_payload(
    setup: Any, prefix: str
) -> None:
    """An undecodable body near the engine's cap makes a record (its bytes in base64) that
    NATS would refuse for ever: it is kept without them, saying so, and the lane goes on."""
    _, job, queue, _ = setup
    spec = await queue.ensure(job)
    raw = b"\xff" + b"x" * 1_000_000
    now_ms = int(time.time() * 1000)
    await queue.bus.publish(job_lane(spec), [Message(f"{prefix}-raw", spec.subject, raw, now_ms)])
    await until(lambda: queue.dlq.count(job), "the undecodable job dead-lettered", 30)
    [record] = await queue.dlq.list(job)
    assert record["id"] == f"{prefix}-raw" and record["error"]["type"] == "DecodeError"
    if queue.bus.driver == "nats":
        assert "raw_b64" not in record and record["payload"] is None
        assert (
            "its payload was dropped from this record: over the engine's message cap"
            in (record["error"]["message"])
        )
    else:
        assert len(record["raw_b64"]) > 1_000_000
    await queue.enqueue(job, {"id": f"{prefix}-after"})
    await until(lambda: DONE[f"{prefix}-after"] == 1, "the next job ran")


async def test_a_run_that_finished_is_never_dead_lettered_as_a_crash(
    setup: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its ack lost (a worker killed between its record and its ack, a lease that ran out
    while the record was stored), the delivery of a job's last attempt comes back past the
    attempts: its record says done, so it is settled, neither dead-lettered as WorkerCrashed
    (4-5 of 20,000 were, on postgres with workers killed every 2 s) nor run again."""
    ctx, _job, queue, _seen = setup
    last: type[Tracked] = type("Last", (Tracked,), {"subject": f"{prefix}.last", "ack_wait_s": 1.0})
    acks: list[str] = []

    def drop_the_first(ack: Any) -> Any:
        async def dropping(delivery: Any) -> None:
            acks.append(delivery.id)
            if len(acks) > 1:
                await ack(delivery)

        return dropping

    wrap_receivers(monkeypatch, ctx.bus("jobs"), {"ack": drop_the_first})
    async with running(ctx, last):
        # retries = 1: attempt 2 succeeds, and is the last; its ack is lost.
        job_id = await last.enqueue(ctx, {"id": f"{prefix}-last", "fail_first": 1, "returns": 7})
        assert await last.result(ctx, job_id, timeout_s=15) == 7
    # Its worker stopped, as one killed after the record: the memory bus hands back what its
    # stopped worker never settled, the others after the ack wait.
    async with running(ctx, last):
        # Acked: that delivery is settled, so nothing can dead-letter it after.
        await until(lambda: len(acks) == 2, "the delivery back, settled", 20)
    assert RUNS[f"{prefix}-last"] == 2 and acks == [job_id, job_id]
    assert await queue.dlq.count(last) == 0
    status = await queue.status(last, job_id)
    assert status is not None and (status.state, status.attempts) == ("done", 2)


class Wrapped(Job):
    """Run through the middlewares below: `mode` says what the run does."""

    bus = "jobs"
    retries = 1
    backoff = {"type": "exponential", "initial": 10, "max": 10}
    timeout_s = 0.5
    keep_result_s = 60
    concurrency = 4

    async def run(self, payload: dict[str, Any], ctx: Context) -> Any:
        RUNS[payload["id"]] += 1
        if payload["mode"] == "flaky" and RUNS[payload["id"]] == 1:
            raise RuntimeError("the first run fails")
        if payload["mode"] == "hang":
            await until_cancelled()  # until the lane's time limit ends it
        return payload["tenant"]


class Recording:
    """The outermost middleware: what each run looked like to it, and how it ended."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    async def __call__(self, run: Run, call_next: CallNext) -> Any:
        self.seen.append(
            ("before", run.id, run.attempt, run.kind, run.name, "tenant" in run.payload)
        )
        try:
            result = await call_next(run)
        except Exception as exc:
            self.seen.append(("raised", run.id, run.attempt, type(exc).__name__))
            raise
        self.seen.append(("returned", run.id, run.attempt, result))
        return result


async def tenant_and_own_retry(run: Run, call_next: CallNext) -> Any:
    """A function middleware: stamps a tenant on the payload, refuses some runs outright, and
    runs a run that raised RuntimeError once more within the same attempt."""
    run.payload = {**run.payload, "tenant": "acme"}
    if run.payload["mode"] == "refused":
        raise Permanent("refused by a middleware")
    try:
        return await call_next(run)
    except RuntimeError:
        return await call_next(run)


async def test_every_run_goes_through_the_contexts_middlewares_in_order(
    setup: Any, prefix: str
) -> None:
    ctx, _job, _queue, _seen = setup
    recording = Recording()
    ctx.middlewares = [recording, tenant_and_own_retry]
    wrapped: type[Wrapped] = type("Wrapped", (Wrapped,), {"subject": f"{prefix}.wrapped"})
    worker = JobRunner(ctx)
    worker.register(wrapped)
    seen: list[dict[str, Any]] = []
    for name in ("done", "retry", "dlq"):
        worker.on(name, seen.append)
    await worker.start()
    queue = worker.queue("jobs")
    try:
        modes = ("ok", "flaky", "hang", "refused")
        for mode in modes:
            await queue.enqueue(wrapped, {"id": f"{prefix}-{mode}", "mode": mode}, id=mode)
        await until(lambda: len(seen) == 5, "two done, a retry and two dead letters")
        ended = sorted((s["signal"], s["id"], s.get("attempt") or s["attempts"]) for s in seen)
        assert ended == [
            ("dlq", "hang", 2),
            ("dlq", "refused", 1),
            ("done", "flaky", 1),
            ("done", "ok", 1),
            ("retry", "hang", 1),
        ]
        # The run had the payload the inner middleware made; the flaky one ran twice in its
        # one attempt; the refused one never ran.
        assert [RUNS[f"{prefix}-{mode}"] for mode in modes] == [1, 2, 2, 0]
        for job_id in ("ok", "flaky"):
            assert await queue.result(wrapped, job_id, timeout_s=5) == "acme"
        records = {r["id"]: r for r in await queue.dlq.list(wrapped)}
        assert records["hang"]["error"]["type"] == "JobTimeout"
        assert records["refused"]["error"] == {
            "type": "Permanent",
            "message": "refused by a middleware",
        }
        # The outermost saw each run first, with the payload as enqueued, and how it ended:
        # the time limit sits inside it.
        name = wrapped.__name__
        assert sorted(recording.seen) == sorted(
            [
                ("before", "ok", 1, "job", name, False),
                ("returned", "ok", 1, "acme"),
                ("before", "flaky", 1, "job", name, False),
                ("returned", "flaky", 1, "acme"),
                ("before", "hang", 1, "job", name, False),
                ("raised", "hang", 1, "JobTimeout"),
                ("before", "hang", 2, "job", name, False),
                ("raised", "hang", 2, "JobTimeout"),
                ("before", "refused", 1, "job", name, False),
                ("raised", "refused", 1, "Permanent"),
            ]
        )
    finally:
        await worker.stop(5)
