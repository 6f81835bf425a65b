"""JobQueue, JobRunner and the DLQ tools against a real nats-server (JetStream, file storage).

Every test uses its own subject (`prefix`), hence its own streams. Timing-sensitive tests use
short backoffs and ack waits and compare against bounds, never against exact durations.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, StreamConfig

from mega.context import Context
from mega.drivers.nats import NatsBus
from mega.drivers.nats.names import HEADER_JOB_ID, dlq_stream_name, stream_name
from mega.errors import DependencyUnavailable, JobError, RegistrationError
from mega.jobs.job import Job
from mega.jobs.queue import SIGNALS, JobQueue
from mega.jobs.runner import JobRunner
from mega.lanes.backoff import BackoffPolicy
from mega.settings import BusSpec
from tests.factories import until_cancelled

# Retries in milliseconds, so the tests spend their time on behaviour, not on waiting.
FAST_BACKOFF = {"type": "exponential", "initial": 20, "max": 50}
Run = Callable[[Any], Awaitable[None]]


async def connect(url: str) -> NatsClient:
    # As the hosts do: an outage is waited out, never fatal.
    return await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    client = await connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
def ctx(nc: NatsClient, nats_url: str) -> Context:
    return Context(
        instance_id="test-worker",
        buses={"jobs": NatsBus("jobs", BusSpec(driver="nats", url=nats_url), nc)},
    )


@pytest.fixture
async def queue(ctx: Context) -> AsyncIterator[JobQueue]:
    jobs = JobQueue(ctx, "jobs", dlq_retry_delay_s=0.3)
    yield jobs
    await jobs.stop(5)


def make_job(prefix: str, run: Run, **attrs: Any) -> type[Job]:
    """A Job class on `<prefix>.job` whose run awaits `run(payload)`."""

    async def run_method(self: Job, payload: Any, ctx: Context) -> None:
        await run(payload)

    body = {"subject": f"{prefix}.job", "bus": "jobs", "backoff": FAST_BACKOFF, "run": run_method}
    return type("TestJob", (Job,), {**body, **attrs})


class Recorder:
    """Every signal of a runtime, in order, with a wait helper."""

    def __init__(self, runtime: JobQueue | JobRunner) -> None:
        self.signals: list[dict[str, Any]] = []
        for name in SIGNALS:
            runtime.on(name, self.signals.append)

    def of(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.signals
            if e["signal"] == name and all(e.get(k) == v for k, v in match.items())
        ]

    async def wait(
        self, name: str, count: int = 1, timeout_s: float = 10, **match: Any
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.of(name, **match)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} x {name} {match} not seen; got {self.signals}")
            await asyncio.sleep(0.01)
        return found


@contextlib.asynccontextmanager
async def consuming(queue: JobQueue, job: type[Job]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(queue.consume(job))
    try:
        yield task
    finally:
        await queue.stop(5)
        await task


async def stream_size(queue: JobQueue, stream: str) -> int:
    assert isinstance(queue.bus, NatsBus)
    return int((await queue.bus.js.stream_info(stream)).state.messages)


# -- the happy paths and retries ---------------------------------------------------------------


async def test_ok_job_is_done_after_one_attempt(queue: JobQueue, prefix: str) -> None:
    payloads: list[Any] = []

    async def run(payload: Any) -> None:
        payloads.append(payload)

    job = make_job(prefix, run)
    seen = Recorder(queue)
    async with consuming(queue, job):
        job_id = await queue.enqueue(job, {"to": "a@example.com"})
        done = await seen.wait("done", id=job_id)
    assert payloads == [{"to": "a@example.com"}]
    assert done[0]["attempt"] == 1 and 0 <= done[0]["duration_ms"] < 5000
    [start] = seen.of("start")
    assert start["attempt"] == 1 and 0 <= start["latency_ms"] < 5000
    # `dispatch` follows the PubAck, which can arrive after the (fast) worker has started.
    events = [e["signal"] for e in seen.signals]
    assert sorted(events) == ["dispatch", "done", "start"]
    assert events.index("start") < events.index("done")
    assert await stream_size(queue, stream_name(job.subject)) == 0


async def test_flaky_job_is_done_after_exactly_two_attempts(queue: JobQueue, prefix: str) -> None:
    calls = 0

    async def run(payload: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("smtp hiccup")

    job = make_job(prefix, run, retries=2)
    seen = Recorder(queue)
    async with consuming(queue, job):
        job_id = await queue.enqueue(job, {})
        await seen.wait("done", id=job_id)
    assert calls == 2
    [retry] = seen.of("retry")
    assert (retry["attempt"], retry["error_type"], retry["error"]) == (
        1,
        "ConnectionError",
        "smtp hiccup",
    )
    assert [e["attempt"] for e in seen.of("start")] == [1, 2]
    assert seen.of("fail") == [] and seen.of("dlq") == []


async def test_failing_job_is_dead_lettered_after_retries_plus_one(
    queue: JobQueue, prefix: str
) -> None:
    calls = 0

    async def run(payload: Any) -> None:
        nonlocal calls
        calls += 1
        raise ValueError(f"bad address (call {calls})")

    job = make_job(prefix, run, retries=2)
    spec = queue.spec(job)
    seen = Recorder(queue)
    before_ms = int(time.time() * 1000)
    async with consuming(queue, job):
        job_id = await queue.enqueue(job, {"to": "x"}, id="order-1")
        await seen.wait("dlq", id=job_id)
        await asyncio.sleep(0.3)  # nothing else may follow
    assert calls == 3
    assert [e["attempt"] for e in seen.of("retry")] == [1, 2]
    [fail] = seen.of("fail")
    assert (fail["phase"], fail["attempt"], fail["error_type"]) == ("run", 3, "ValueError")
    assert await stream_size(queue, stream_name(spec.subject)) == 0
    assert await queue.dlq.count(job) == 1
    [record] = await queue.dlq.list(job)
    assert record["id"] == "order-1"
    assert record["subject"] == spec.subject
    assert record["payload"] == {"to": "x"}
    assert record["error"] == {"type": "ValueError", "message": "bad address (call 3)"}
    assert record["attempts"] == 3
    assert record["first_enqueued_at"] is not None
    assert before_ms <= record["first_enqueued_at"] <= record["failed_at"]
    assert record["failed_at"] <= int(time.time() * 1000)
    assert record["worker"] == "test-worker"


async def test_retry_delays_stay_within_the_jittered_bounds(queue: JobQueue, prefix: str) -> None:
    starts: list[float] = []

    async def run(payload: Any) -> None:
        starts.append(time.monotonic())
        raise RuntimeError("down")

    backoff = {"type": "exponential", "initial": 200, "max": 400}
    job = make_job(prefix, run, retries=3, backoff=backoff)
    seen = Recorder(queue)
    async with consuming(queue, job):
        await queue.enqueue(job, {})
        await seen.wait("dlq")
    assert len(starts) == 4
    policy = BackoffPolicy.parse(backoff)
    for attempt, retry in enumerate(seen.of("retry"), start=1):
        assert retry["attempt"] == attempt
        assert 0 <= retry["delay_ms"] <= policy.ceiling_ms(attempt)
        gap_s = starts[attempt] - starts[attempt - 1]
        # Never early; late only by scheduling noise.
        assert retry["delay_ms"] / 1000 - 0.02 <= gap_s <= retry["delay_ms"] / 1000 + 0.5


async def test_same_id_runs_once(queue: JobQueue, prefix: str) -> None:
    runs: list[Any] = []

    async def run(payload: Any) -> None:
        runs.append(payload)

    job = make_job(prefix, run)
    seen = Recorder(queue)
    first = await queue.enqueue(job, {"n": 1}, id="invoice-42")
    second = await queue.enqueue(job, {"n": 2}, id="invoice-42")
    assert first == second == "invoice-42"
    assert [e["duplicate"] for e in seen.of("dispatch")] == [False, True]
    assert await stream_size(queue, stream_name(job.subject)) == 1
    async with consuming(queue, job):
        last = await queue.enqueue(job, {"n": 3})  # FIFO with concurrency 1: runs after it
        await seen.wait("done", id=last)
    assert runs == [{"n": 1}, {"n": 3}]


async def test_non_json_payload_is_rejected_and_nothing_published(
    queue: JobQueue, prefix: str
) -> None:
    job = make_job(prefix, lambda payload: asyncio.sleep(0))
    for payload in (object(), {"when": time}, float("nan")):
        with pytest.raises(JobError) as caught:
            await queue.enqueue(job, payload)
        assert caught.value.code == "job.invalid_payload"
    with pytest.raises(JobError):
        await queue.enqueue_many(job, [{"ok": 1}, {"bad": {1, 2}}])
    assert await stream_size(queue, stream_name(job.subject)) == 0


async def test_enqueue_many_returns_every_id_in_order(queue: JobQueue, prefix: str) -> None:
    ran: list[int] = []

    async def run(payload: Any) -> None:
        ran.append(payload["i"])

    job = make_job(prefix, run, concurrency=50)
    seen = Recorder(queue)
    ids = await queue.enqueue_many(job, [{"i": i} for i in range(500)])
    assert len(set(ids)) == 500
    assert await stream_size(queue, stream_name(job.subject)) == 500
    async with consuming(queue, job):
        await seen.wait("done", count=500)
    assert sorted(ran) == list(range(500))
    assert [e["id"] for e in seen.of("dispatch")] == ids


# -- slots, delays, leases ---------------------------------------------------------------------


async def test_never_more_in_flight_than_concurrency(queue: JobQueue, prefix: str) -> None:
    assert isinstance(queue.bus, NatsBus)
    running = peak = 0

    async def run(payload: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.1)
        running -= 1

    job = make_job(prefix, run, concurrency=2)
    seen = Recorder(queue)
    await queue.enqueue_many(job, [{}] * 8)
    async with consuming(queue, job):
        await seen.wait("start", count=2)
        info = await queue.bus.js.consumer_info(stream_name(job.subject), "mega_workers")
        assert info.num_ack_pending <= 2
        assert info.config.max_ack_pending == 2
        assert info.config.ack_policy == AckPolicy.EXPLICIT
        assert info.config.max_deliver == -1
        await seen.wait("done", count=8)
    assert peak == 2


async def test_delayed_job_runs_after_its_delay_without_holding_a_slot(
    queue: JobQueue, prefix: str
) -> None:
    assert isinstance(queue.bus, NatsBus)
    started: dict[str, float] = {}

    async def run(payload: Any) -> None:
        started[payload["name"]] = time.monotonic()

    job = make_job(prefix, run, concurrency=1)
    seen = Recorder(queue)
    async with consuming(queue, job):
        enqueued = time.monotonic()
        later = await queue.enqueue(job, {"name": "later"}, delay=1.0)
        now = await queue.enqueue(job, {"name": "now"})
        await seen.wait("done", id=now)
        # The only slot is free while the delayed job waits: once the ack of "now" has been
        # applied (acks are not awaited), nothing is pending on the consumer.
        for _ in range(50):
            info = await queue.bus.js.consumer_info(stream_name(job.subject), "mega_workers")
            if info.num_ack_pending == 0:
                break
            await asyncio.sleep(0.01)
        assert info.num_ack_pending == 0
        assert "later" not in started
        await seen.wait("done", id=later)
    assert started["now"] - enqueued < 0.9
    assert started["later"] - enqueued >= 0.95
    [start] = seen.of("start", id=later)
    assert start["attempt"] == 1  # waiting is not an attempt
    assert start["latency_ms"] < 500  # measured from the due time, not from the enqueue
    assert await stream_size(queue, stream_name(job.subject)) == 0


async def test_long_job_keeps_its_lease_with_heartbeats(queue: JobQueue, prefix: str) -> None:
    assert isinstance(queue.bus, NatsBus)
    runs = 0

    async def run(payload: Any) -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(3)  # three times the ack wait

    job = make_job(prefix, run, ack_wait_s=1)
    seen = Recorder(queue)
    async with consuming(queue, job):
        job_id = await queue.enqueue(job, {})
        await seen.wait("done", id=job_id, timeout_s=10)
        info = await queue.bus.js.consumer_info(stream_name(job.subject), "mega_workers")
    assert runs == 1
    assert len(seen.of("start")) == 1
    assert info.num_redelivered == 0


async def test_without_heartbeats_the_same_long_job_is_redelivered(
    queue: JobQueue, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test above: the lease renewal is what keeps the job single."""
    from mega.lanes.consumer import Consumer

    async def no_heartbeat(self: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(Consumer, "_heartbeat", no_heartbeat)
    runs = 0

    async def run(payload: Any) -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(3)  # the run itself: three ack waits long

    job = make_job(prefix, run, ack_wait_s=1, concurrency=2)
    seen = Recorder(queue)
    async with consuming(queue, job):
        job_id = await queue.enqueue(job, {})
        await seen.wait("done", id=job_id, timeout_s=10)
    assert runs >= 2  # the broker gave up on the silent lease and delivered it again
    assert [e["attempt"] for e in seen.of("start")][:2] == [1, 2]


# -- failures around the DLQ -------------------------------------------------------------------


async def test_job_is_kept_while_the_dlq_stream_is_missing(queue: JobQueue, prefix: str) -> None:
    assert isinstance(queue.bus, NatsBus)
    runs = 0

    async def run(payload: Any) -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("permanent")

    job = make_job(prefix, run, retries=0)
    spec = await queue.ensure(job)
    await queue.bus.js.delete_stream(dlq_stream_name(spec.subject))
    seen = Recorder(queue)
    async with consuming(queue, job):
        job_id = await queue.enqueue(job, {"keep": "me"})
        await seen.wait("fail", count=2, phase="dlq_publish")  # tried, nacked, tried again
        assert await stream_size(queue, stream_name(spec.subject)) == 1  # not acked: nothing lost
        await queue.ensure(job, force=True)  # the operator brings the DLQ back
        await seen.wait("dlq", id=job_id)
    assert runs == 1  # exhausted jobs are never run again, only re-recorded
    assert await stream_size(queue, stream_name(spec.subject)) == 0
    [record] = await queue.dlq.list(job)
    assert record["error"] == {"type": "RuntimeError", "message": "permanent"}
    assert (record["payload"], record["attempts"]) == ({"keep": "me"}, 1)


async def test_undecodable_message_is_dead_lettered_and_terminated(
    queue: JobQueue, prefix: str
) -> None:
    assert isinstance(queue.bus, NatsBus)
    runs = 0

    async def run(payload: Any) -> None:
        nonlocal runs
        runs += 1

    job = make_job(prefix, run)
    spec = await queue.ensure(job)
    seen = Recorder(queue)
    raw = b"\xff{not json"
    await queue.bus.js.publish(spec.subject, raw, headers={HEADER_JOB_ID: "raw-1"})
    async with consuming(queue, job):
        await seen.wait("dlq", id="raw-1")
    assert runs == 0
    [fail] = seen.of("fail")
    assert (fail["phase"], fail["error_type"]) == ("decode", "DecodeError")
    [record] = await queue.dlq.list(job)
    assert record["payload"] is None
    assert base64.b64decode(record["raw_b64"]) == raw
    assert record["error"]["type"] == "DecodeError"
    assert await stream_size(queue, stream_name(spec.subject)) == 0
    with pytest.raises(JobError) as caught:
        await queue.dlq.requeue(job, "raw-1")
    assert caught.value.code == "job.not_requeueable"


# -- stop and outages --------------------------------------------------------------------------


async def test_stop_lets_in_flight_jobs_finish(queue: JobQueue, prefix: str) -> None:
    async def run(payload: Any) -> None:
        await asyncio.sleep(0.5)  # the run itself: still going when the stop comes

    job = make_job(prefix, run, concurrency=3)
    seen = Recorder(queue)
    await queue.enqueue_many(job, [{}] * 3)
    task = asyncio.create_task(queue.consume(job))
    await seen.wait("start", count=3)
    await queue.stop(timeout_s=5)
    assert task.done()
    assert len(seen.of("done")) == 3
    # Acked before stop() returned; the server removes them from the work queue just after.
    deadline = time.monotonic() + 5
    while (
        left := await stream_size(queue, stream_name(job.subject))
    ) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert left == 0


async def test_stop_timeout_hands_unfinished_jobs_back(queue: JobQueue, prefix: str) -> None:
    async def run(payload: Any) -> None:
        await until_cancelled()  # the run itself: longer than the stop waits

    job = make_job(prefix, run)
    seen = Recorder(queue)
    await queue.enqueue(job, {})
    task = asyncio.create_task(queue.consume(job))
    await seen.wait("start")
    began = time.monotonic()
    await queue.stop(timeout_s=0.2)
    assert time.monotonic() - began < 2
    assert task.done()
    assert seen.of("done") == []
    assert await stream_size(queue, stream_name(job.subject)) == 1  # back for redelivery


async def test_nats_restart_during_a_run_loses_no_job(
    nats_factory: Callable[[], Any], prefix: str
) -> None:
    server = nats_factory()
    client = await connect(server.url)
    ctx = Context(
        instance_id="w",
        buses={"jobs": NatsBus("jobs", BusSpec(driver="nats", url=server.url), client)},
    )
    queue = JobQueue(ctx, "jobs")
    done: set[int] = set()

    async def run(payload: Any) -> None:
        await asyncio.sleep(0.01)
        done.add(payload["i"])

    # A short ack wait: acks lost in the outage come back quickly.
    job = make_job(prefix, run, concurrency=10, ack_wait_s=2)
    await queue.enqueue_many(job, [{"i": i} for i in range(300)])  # every PubAck is in
    task = asyncio.create_task(queue.consume(job))
    try:
        while len(done) < 50:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(server.stop)
        assert len(done) < 300
        while client.is_connected:
            await asyncio.sleep(0.01)
        with pytest.raises(DependencyUnavailable):  # what the web layer turns into a 503
            await queue.enqueue(job, {"i": -1})
        await asyncio.sleep(0.5)  # the outage: the consumer's loop meets a server still down
        await asyncio.to_thread(server.start)
        deadline = time.monotonic() + 30
        while len(done) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert done == set(range(300))  # same consume loop, no restart of the host; no -1
        assert not task.done()
    finally:
        await queue.stop(5)
        await task
        await client.close()


async def test_deleted_consumer_is_recreated_and_consuming_resumes(
    queue: JobQueue, prefix: str
) -> None:
    assert isinstance(queue.bus, NatsBus)
    job = make_job(prefix, lambda payload: asyncio.sleep(0))
    seen = Recorder(queue)
    async with consuming(queue, job) as task:
        await seen.wait("done", id=await queue.enqueue(job, {}))
        await queue.bus.js.delete_consumer(stream_name(job.subject), "mega_workers")
        await seen.wait("done", id=await queue.enqueue(job, {}))
        assert not task.done()


# -- streams, DLQ tools, worker ----------------------------------------------------------------


async def test_ensure_is_idempotent_and_keeps_existing_limits(
    queue: JobQueue, ctx: Context, prefix: str
) -> None:
    assert isinstance(queue.bus, NatsBus)
    job = make_job(prefix, lambda payload: asyncio.sleep(0), concurrency=4, ack_wait_s=7)
    spec = queue.spec(job)
    await queue.bus.js.add_stream(
        StreamConfig(
            name=dlq_stream_name(spec.subject), subjects=[spec.subject + ".dlq"], max_age=3600
        )
    )
    await queue.ensure(job)
    await JobQueue(ctx, "jobs").ensure(job)  # a second process
    dlq_info = await queue.bus.js.stream_info(dlq_stream_name(spec.subject))
    assert dlq_info.config.max_age == 3600  # the operator's limit survives
    work = (await queue.bus.js.stream_info(stream_name(spec.subject))).config
    assert work.retention == "workqueue" and work.storage == "file"
    consumer = (await queue.bus.js.consumer_info(stream_name(spec.subject), "mega_workers")).config
    assert (consumer.max_ack_pending, consumer.ack_wait) == (4, 7)


async def test_different_limits_are_reported_and_applied_only_when_told(
    queue: JobQueue, ctx: Context, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert isinstance(queue.bus, NatsBus)
    job = make_job(prefix, lambda payload: asyncio.sleep(0), concurrency=4, ack_wait_s=7)
    spec = await queue.ensure(job)
    # A stale deployment (or a typo) says concurrency 9: said in one line, not applied.
    bigger = make_job(prefix, lambda payload: asyncio.sleep(0), concurrency=9, ack_wait_s=7)
    await JobQueue(ctx, "jobs").ensure(bigger)
    consumer = (await queue.bus.js.consumer_info(stream_name(spec.subject), "mega_workers")).config
    assert consumer.max_ack_pending == 4
    [line] = [r.getMessage() for r in caplog.records if "running consumer" in r.getMessage()]
    assert "concurrency 4 and ack wait 7 s, the class says 9 and 7 s" in line
    assert "--apply-limits" in line
    # Told (`mega worker --apply-limits`): the class's limits take effect.
    await JobQueue(ctx, "jobs", apply_limits=True).ensure(bigger)
    consumer = (await queue.bus.js.consumer_info(stream_name(spec.subject), "mega_workers")).config
    assert consumer.max_ack_pending == 9


async def test_fresh_dlq_stream_has_the_class_limits(queue: JobQueue, prefix: str) -> None:
    assert isinstance(queue.bus, NatsBus)
    job = make_job(prefix, lambda payload: asyncio.sleep(0), dlq_max_bytes=1 << 20)
    spec = await queue.ensure(job)
    config = (await queue.bus.js.stream_info(dlq_stream_name(spec.subject))).config
    assert config.retention == "limits"
    assert config.max_age == 7 * 24 * 3600
    assert config.max_bytes == 1 << 20
    forever = make_job(prefix + "x", lambda payload: asyncio.sleep(0), dlq_max_age_s=0)
    spec = await queue.ensure(forever)
    assert not (await queue.bus.js.stream_info(dlq_stream_name(spec.subject))).config.max_age


async def test_dlq_list_requeue_and_purge(queue: JobQueue, prefix: str) -> None:
    healthy = False
    runs: list[tuple[str, bool]] = []

    async def run(payload: Any) -> None:
        runs.append((payload["name"], healthy))
        if not healthy:
            raise RuntimeError("mailbox full")

    job = make_job(prefix, run, retries=0)
    seen = Recorder(queue)
    async with consuming(queue, job):
        for name in ("a", "b", "c"):
            await queue.enqueue(job, {"name": name}, id=f"id-{name}")
            await seen.wait("dlq", id=f"id-{name}")
        records = await queue.dlq.list(job)
        assert [r["id"] for r in records] == ["id-c", "id-b", "id-a"]  # newest first
        assert [r["id"] for r in await queue.dlq.list(job, limit=2)] == ["id-c", "id-b"]
        healthy = True
        assert await queue.dlq.requeue(job, "id-b") == 1
        done = await seen.wait("done", id="id-b")
        assert done[0]["attempt"] == 1  # attempts reset
        assert await queue.dlq.requeue(job, "no-such-id") == 0
        assert await queue.dlq.count(job) == 2
        assert await queue.dlq.requeue_all(job) == 2
        await seen.wait("done", count=3)
        assert await queue.dlq.count(job) == 0
        healthy = False
        await queue.enqueue(job, {"name": "d"}, id="id-d")
        await seen.wait("dlq", id="id-d")
        # Requeued and failing again at once: a fresh record, not a deduplicated one.
        assert await queue.dlq.requeue(job, "id-d") == 1
        await seen.wait("dlq", count=2, id="id-d")
        assert await queue.dlq.count(job) == 1
    assert await queue.dlq.purge(job) == 1
    assert await queue.dlq.count(job) == 0
    assert sorted(name for name, ok in runs if ok) == ["a", "b", "c"]


async def test_worker_runs_registered_jobs_and_re_emits_events(ctx: Context, prefix: str) -> None:
    ran: list[str] = []

    async def run_a(payload: Any) -> None:
        ran.append("a")

    async def run_b(payload: Any) -> None:
        raise RuntimeError("b fails")

    job_a = make_job(prefix + "a", run_a)
    job_b = make_job(prefix + "b", run_b, retries=1)
    worker = JobRunner(ctx, instance_id="host-1")
    seen = Recorder(worker)
    worker.register(job_a)
    worker.register(job_b)
    with pytest.raises(JobError):
        worker.register(job_a)
    with pytest.raises(RegistrationError, match=r"invalid: bus: "):
        worker.register(make_job(prefix + "c", run_a, bus="elsewhere"))
    with pytest.raises(ValueError, match="unknown signal"):
        worker.on("finished", print)
    began = time.monotonic()
    await worker.start()
    try:
        queue = worker.queue("jobs")
        await queue.enqueue(job_a, {})
        b_id = await queue.enqueue(job_b, {})
        await seen.wait("done")
        [dlq] = await seen.wait("dlq", id=b_id)
        assert time.monotonic() - began < 5
    finally:
        await worker.stop(5)
    assert ran == ["a"]
    assert dlq["attempts"] == 2
    names = {e["signal"] for e in seen.signals}
    assert names == {"dispatch", "start", "done", "retry", "fail", "dlq"}
    [record] = await worker.queue("jobs").dlq.list(job_b)
    assert record["worker"] == "host-1"


async def test_queue_refuses_a_job_of_another_bus(queue: JobQueue, ctx: Context) -> None:
    ctx.buses["other"] = ctx.buses["jobs"]
    job = make_job("x", lambda payload: asyncio.sleep(0), bus="other")
    with pytest.raises(JobError) as caught:
        await queue.enqueue(job, {})
    assert caught.value.code == "job.wrong_bus"
