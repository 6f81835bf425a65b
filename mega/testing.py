"""mega.testing: unit-test your own Schedules, Jobs, Listeners and Worker tasks in milliseconds,
no servers.

    from mega.testing import drain, failing, memory_context, planned_ticks, run_tick

    async def test_welcome_email_retries_then_succeeds() -> None:
        ctx = memory_context("jobs", caches=["main"])   # bus "jobs", Redis "main", in memory
        await JobQueue(ctx, "jobs").enqueue(SendWelcome, {"to": "ada@example.com"})
        with failing(SendWelcome, times=1):             # the first run raises
            report = await drain(ctx, jobs=[SendWelcome])
        assert report.count("SendWelcome", "retry") == 1
        assert report.count("SendWelcome", "done") == 1

    def test_the_report_runs_at_nine_in_berlin_across_dst() -> None:
        ticks = planned_ticks(DailyReport, datetime(2026, 3, 28, tzinfo=UTC), days=2)

- `memory_context(*buses, caches=...)`: a Context whose buses are `memory` ones (jobs and
  events) and whose caches are in-memory Redis servers (fakeredis: `mega-py[testing]`). No
  database: a Listener with `inbox = "db"` needs `ctx.database` set to a migrated one.
- `drain(ctx, jobs=..., listeners=..., hooks=...)`: runs the jobs and listener groups you name
  on everything enqueued or emitted for them, and on what follows (retries, jobs their
  listeners enqueue), until none has anything left; backoffs and delays are skipped, not
  slept. Returns the signals it saw, progress reports included.
- `planned_ticks(cls, start, days=...)` and `run_tick(cls, ctx, instant)`: a schedule's planned
  instants from its cron and time zone (DST days included), and one run at a chosen instant
  with the Tick its run sees, without a scheduler or a lock.
- `worker_pool(cls, ctx)`: a Worker's real pool (one child process by default, ~0.1 s to
  start; `mode="thread"` for none) as `ctx.workers[name]`, stopped at the end of the block.
- `fake_clock(start=None)`: time that moves only when told. Within the block, what mega
  decides by time (a delayed job, a retry's backoff, a pause or cancel window, a record's
  keep, a schedule's instants) reads the FakeClock it yields; `await clock.advance(3600)`
  moves an hour on at once, firing what falls due on the way in order. A server's own times
  (a NATS ack wait, a Redis TTL) and a run's time limit stay on real time.
- Faults: `failing(cls, times=n)` makes the next n runs of a Job, Listener or Schedule class
  raise; `failing_dlq(times=n)` makes the next n dead-letter writes fail (the job must come
  back and write its record later, never be lost); `kill_child(pool)` SIGKILLs a pool's child
  process, as a crash would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from mega import clock
from mega.clock import FakeClock
from mega.context import CacheAdapter, Context
from mega.drivers.memory import MemoryBroker, MemoryBus, MemoryLane
from mega.errors import JobError
from mega.events import bus as events_bus
from mega.events.bus import group_lane
from mega.events.listener import Listener
from mega.events.runner import ListenerRunner
from mega.jobs import queue as jobs_queue
from mega.jobs.job import Job
from mega.jobs.runner import JobRunner
from mega.jobs.spec import job_lane
from mega.lanes.dlq import DlqRecord
from mega.lanes.middleware import Middleware
from mega.schedules import cron
from mega.schedules.schedule import Schedule, ScheduleSpec, Tick, validate_schedule
from mega.settings import BusSpec
from mega.workers.pool import WorkerPool
from mega.workers.worker import Worker

# drain() gives up after this many rounds without getting to the end (a job that enqueues
# itself forever, say), rather than spin.
MAX_ROUNDS = 10_000
# What a drain records: every signal of a run (not "dispatch" nor "emit", which happen before).
JOB_SIGNALS = tuple(name for name in jobs_queue.SIGNALS if name != "dispatch")
LISTENER_SIGNALS = tuple(name for name in events_bus.SIGNALS if name != "emit")
# A hook is called as hook(runtime, ctx), async or not, as the config's `hooks` are.
Hook = Callable[[Any, Context], Any]
HOOK_KEYS = ("worker", "listeners")  # the config's keys for a JobRunner and a ListenerRunner


def memory_context(
    *buses: str,
    caches: Iterable[str] = (),
    instance_id: str = "test",
    middlewares: Iterable[Middleware] = (),
) -> Context:
    """A Context with `memory` buses and empty in-memory Redis servers. Each call gets servers
    of its own, so tests never see each other's keys.

    Args:
        *buses: the bus aliases, a `memory` bus under each; none gives one, "jobs".
        caches: the cache aliases, an empty in-memory Redis under each:
            `ctx.cache(alias).native` is a `fakeredis.FakeAsyncRedis`, a redis.asyncio client
            (strings, hashes, sets, sorted sets, streams, pipelines and Lua).
        instance_id: the context's instance id.
        middlewares: what every run goes through, as the config's (mega.lanes.middleware).
    """
    ctx = Context(instance_id=instance_id, middlewares=list(middlewares))
    for alias in buses or ("jobs",):
        ctx.buses[alias] = MemoryBus(alias, BusSpec(driver="memory"), MemoryBroker())
    for alias in caches:
        ctx.caches[alias] = CacheAdapter(alias, f"memory://{alias}", _fake_redis())
    return ctx


def _fake_redis() -> Any:
    try:
        import fakeredis  # an optional dependency: only tests with caches need it
    except ImportError:
        raise ImportError(
            "memory_context(caches=...) needs fakeredis: pip install 'mega-py[testing]'"
        ) from None
    # decode_responses as the hosts' clients (mega.runtime.bootstrap.connect_redis): str, not bytes.
    return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)


@dataclass
class DrainReport:
    """What `drain` saw: every signal of the jobs and listeners it ran, in order."""

    signals: list[dict[str, Any]] = field(default_factory=list)

    def count(self, name: str, signal: str) -> int:
        """How many signals of one kind a job or a listener group sent.

        Args:
            name: the job's name, or the listener group's.
            signal: "start", "done", "retry", "fail", "dlq", and a job's "progress" reports or
                a group's "skip"s (its inbox knew the id).
        """
        return sum(
            1
            for seen in self.signals
            if seen["signal"] == signal and name in (seen.get("job"), seen.get("group"))
        )

    @property
    def totals(self) -> Counter[str]:
        return Counter(seen["signal"] for seen in self.signals)


async def drain(
    ctx: Context,
    *,
    jobs: Iterable[type[Job]] = (),
    listeners: Iterable[type[Listener]] = (),
    hooks: Mapping[str, Iterable[Hook]] | None = None,
) -> DrainReport:
    """Run the given jobs and listener groups on the context's memory buses until none of them
    has anything ready, running or waiting; their waiting retries and delayed jobs are made due
    at once. What is queued for a job or group not named here stays queued, untouched.

    Args:
        ctx: a context whose buses are `memory` ones, as `memory_context` makes.
        jobs: the Job classes to run.
        listeners: the Listener classes whose groups to run.
        hooks: the config's `hooks` shape: {"worker": [...], "listeners": [...]}, each called
            as hook(runtime, ctx) on the JobRunner or the ListenerRunner before it starts, so
            the signal observers your app attaches run too. None: no hooks.
    """
    report = DrainReport()
    job_worker, listener_worker = JobRunner(ctx), ListenerRunner(ctx)
    job_specs = [job_worker.register(job_cls) for job_cls in jobs]
    group_specs = [listener_worker.register(listener_cls) for listener_cls in listeners]
    for name in JOB_SIGNALS:
        job_worker.on(name, report.signals.append)
    for name in LISTENER_SIGNALS:
        listener_worker.on(name, report.signals.append)
    await _run_hooks(hooks or {}, {"worker": job_worker, "listeners": listener_worker}, ctx)
    await listener_worker.start()
    await job_worker.start()
    try:
        # The lanes exist once the workers have started (a new group's is made by its ensure).
        lanes = [_broker(ctx, spec.bus).lane(job_lane(spec)) for spec in job_specs]
        lanes += [_broker(ctx, spec.bus).lane(group_lane(spec)) for spec in group_specs]
        for _ in range(MAX_ROUNDS):
            await clock.settle()
            if not any(lane.busy for lane in lanes):
                break
            for lane in lanes:
                lane.fast_forward()
        else:
            raise RuntimeError(f"drain: still busy after {MAX_ROUNDS} rounds (a job loop?)")
    finally:
        await job_worker.stop(1)
        await listener_worker.stop(1)
    return report


def _broker(ctx: Context, alias: str) -> MemoryBroker:
    bus = ctx.bus(alias)
    if not isinstance(bus, MemoryBus):
        raise JobError(
            f"drain runs memory buses only; bus {alias!r} is {bus.driver}", code="job.driver"
        )
    return bus.native


async def _run_hooks(
    hooks: Mapping[str, Iterable[Hook]], runtimes: dict[str, Any], ctx: Context
) -> None:
    unknown = sorted(set(hooks) - set(HOOK_KEYS))
    if unknown:
        raise ValueError(f"drain: hooks {unknown} are not among {list(HOOK_KEYS)}")
    for key, key_hooks in hooks.items():
        for hook in key_hooks:
            result = hook(runtimes[key], ctx)
            if inspect.isawaitable(result):
                await result


@contextlib.contextmanager
def fake_clock(start: datetime | None = None) -> Iterator[FakeClock]:
    """A FakeClock as the clock mega reads within the block.

    Args:
        start: the clock's time at first; None is now. A naive datetime is read in the host's
            local time.
    """
    with clock.using(FakeClock(start)) as fake:
        yield fake


@contextlib.contextmanager
def failing(
    cls: type[Job] | type[Listener] | type[Schedule],
    *,
    times: int = 1,
    error: Exception | None = None,
) -> Iterator[None]:
    """The next `times` runs of `cls` raise `error`; the runs after those are the class's own.

    Args:
        cls: the Job, Listener or Schedule class; its `run` is replaced within the block.
        times: how many runs raise.
        error: what they raise; None is RuntimeError("injected failure").
    """
    original = cls.run
    left = [times]

    def fail_now() -> None:
        if left[0] > 0:
            left[0] -= 1
            raise error or RuntimeError("injected failure")

    async def run(self: Any, *args: Any) -> Any:
        fail_now()
        return await original(self, *args)

    def plain_run(self: Any, *args: Any) -> Any:  # a plain `def run` stays one (on its thread)
        fail_now()
        return original(self, *args)

    cls.run = run if inspect.iscoroutinefunction(original) else plain_run  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        cls.run = original  # type: ignore[method-assign]


@contextlib.contextmanager
def failing_dlq(*, times: int = 1, error: Exception | None = None) -> Iterator[None]:
    """The next `times` dead-letter writes on memory buses raise `error`, as a DLQ publish that
    gets no PubAck would: the job is not let go, and comes back to write its record again.

    Args:
        times: how many writes raise.
        error: what they raise; None is ConnectionError("injected DLQ publish failure").
    """
    original = MemoryLane.dead_letter
    left = [times]

    def dead_letter(self: MemoryLane, record: DlqRecord) -> None:
        if left[0] > 0:
            left[0] -= 1
            raise error or ConnectionError("injected DLQ publish failure")
        original(self, record)

    MemoryLane.dead_letter = dead_letter  # type: ignore[method-assign]
    try:
        yield
    finally:
        MemoryLane.dead_letter = original  # type: ignore[method-assign]


def planned_ticks(
    schedule_cls: type[Schedule], start: datetime, *, days: float = 1, limit: int = 100_000
) -> list[datetime]:
    """The schedule's planned instants after `start` and within `days`, in its time zone.
    RegistrationError for a class `mega scheduler` refuses (a bad cron, say).

    Args:
        schedule_cls: the Schedule class; one with `cron = None` has no instants of its own.
        start: an aware datetime; the instants after it count.
        days: how long after `start` to look, in days (0.5 is twelve hours).
        limit: the most instants returned.
    """
    spec = _validated_schedule(schedule_cls, locks=())
    end = start + timedelta(days=days)
    found: list[datetime] = []
    after = start
    while spec.cron is not None and len(found) < limit:  # `cron = None`: entries only
        instant = cron.next(spec.cron, after, spec.timezone)
        if instant > end:
            break
        found.append(instant)
        after = instant
    return found


async def run_tick(
    schedule_cls: type[Schedule],
    ctx: Context,
    instant: datetime,
    *,
    fence: int | None = None,
    key: str | None = None,
    args: dict[str, Any] | None = None,
) -> Tick:
    """Run the schedule once as the scheduler would at `instant` (no lock, no audit); returns
    the Tick its run saw. Whatever the run raises is raised here; RegistrationError, before it
    runs, for a class `mega scheduler` refuses (a bad cron, say).

    Args:
        schedule_cls: the Schedule class.
        ctx: the context the run gets a shallow copy of, with the Tick in `extras["tick"]`;
            the aliases of its locks count as declared.
        instant: the planned instant, the run's `self.tick.instant`.
        fence: the run's `self.tick.fence`; None, as without a lock.
        key: the key of the dynamic entry this is a tick of (`self.key`); None is the class's
            own cron.
        args: that entry's arguments (`self.args`); None gives {}.
    """
    _validated_schedule(schedule_cls, locks=ctx.locks)
    tick = Tick(instant, fence, "schedule", ctx.instance_id)
    run_ctx = dataclasses.replace(ctx, extras={**ctx.extras, "tick": tick})  # as the scheduler
    await schedule_cls(tick, key, args).run(run_ctx)
    return tick


def _validated_schedule(schedule_cls: type[Schedule], locks: Iterable[str]) -> ScheduleSpec:
    """The class checked as the scheduler registers it; its lock's alias is taken as declared
    (no lock is taken here, and a memory context declares none)."""
    lock = getattr(schedule_cls, "lock", None)
    alias = lock.get("lock") if isinstance(lock, dict) else None
    return validate_schedule(schedule_cls, {*locks, *([alias] if isinstance(alias, str) else [])})


@contextlib.asynccontextmanager
async def worker_pool(
    worker_cls: type[Worker],
    ctx: Context | None = None,
    *,
    mode: str | None = None,
    pool_size: int = 1,
    root: Path | str | None = None,
) -> AsyncIterator[WorkerPool]:
    """Start the Worker's pool as a host would, put it in `ctx.workers[name]` when a context is
    given, and stop it when the block ends. Your code that calls
    `ctx.workers[name].run(task, args)` runs unchanged; the task module's functions stay plain
    functions you may also call directly.

    Args:
        worker_cls: the Worker class.
        ctx: the context whose `workers` holds the pool within the block; None: none does.
        mode: "process" or "thread"; None is the class's.
        pool_size: how many slots, whatever the class says.
        root: the project root its `task_file` is found from; None is the current directory.
    """
    settings = {"name": worker_cls.name, "pool_size": pool_size, "mode": mode or worker_cls.mode}
    sized: type[Worker] = type(worker_cls.__name__, (worker_cls,), settings)
    pool = WorkerPool(sized, root=root)
    await pool.start()
    if ctx is not None:
        ctx.workers[pool.name] = pool
    try:
        yield pool
    finally:
        if ctx is not None and ctx.workers.get(pool.name) is pool:
            del ctx.workers[pool.name]
        await pool.stop(timeout_s=1)


def kill_child(pool: WorkerPool) -> int:
    """SIGKILL one child process of a running pool (the one running a task, if any), as a
    segfault or an OOM kill would; returns its pid. The pool treats it as any crash: that task
    fails with WorkerError `worker.crashed`, a replacement starts and `restarts` grows by one.
    ValueError in thread mode: a thread cannot be killed, so use mode="process".

    Args:
        pool: the pool, as `worker_pool` yields it.
    """
    pid = pool.kill_one()
    if pid is None:
        raise ValueError(f"pool {pool.name}: no child process to kill (thread mode, or stopped)")
    return pid
