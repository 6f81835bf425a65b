"""The listeners' contract, written once and proven on every bus driver: fan-out to each group,
exact attempt counts, DLQ records and a requeue that reaches one group only, time limits and
`Permanent`, dedup ids, name patterns, a new group replaying kept events, stats and the drain.
`nats` runs on the session's nats-server, `redis` on its Redis (and on its Redis Cluster),
`memory` in this process (as the jobs' contract suite)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mega import (
    Context,
    Event,
    EventBus,
    Job,
    JobQueue,
    JobRunner,
    Listener,
    ListenerRunner,
    Permanent,
    ReceivedEvent,
)
from mega.config import load_config
from mega.drivers.base import Message
from mega.lanes.delivery import stand_in_id
from mega.runtime import Cause
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.jobs.test_contract import (
    CONTRACT_DRIVERS,
    bus_body,
    config_redis_url,
    driver_of,
    until,
)

RUNS: Counter[tuple[str, str]] = Counter()  # (group, event id) -> runs started
ATTEMPTS: dict[tuple[str, str], list[int]] = {}
AFTER: set[str] = set()  # the payloads' `n` of the jobs that ran after a poison event


class Recorder(Listener):
    """Records each run; `fail_first` in the payload fails that many runs of each group."""

    retries = 2
    concurrency = 4
    backoff = {"type": "exponential", "initial": 10, "max": 20}

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        key = (self.group, event.id)
        RUNS[key] += 1
        ATTEMPTS.setdefault(key, []).append(event.attempt)
        await asyncio.sleep(event.data.get("sleep_s", 0))
        if RUNS[key] <= event.data.get("fail_first", 0):
            raise RuntimeError(f"planned failure {RUNS[key]}")


class Limited(Recorder):
    """A Recorder with a time limit, whose `permanent` events fail past any retry."""

    timeout_s = 0.3

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        if event.data.get("permanent"):
            RUNS[(self.group, event.id)] += 1
            raise Permanent(f"no user {event.data['permanent']!r}: retrying will not make one")
        await super().run(event, ctx)


class Setup:
    def __init__(self, ctx: Context, prefix: str, driver: str) -> None:
        self.ctx, self.prefix, self.driver = ctx, prefix, driver
        self.signed: type[Event] = type(
            "Signed", (Event,), {"name": f"{prefix}.user.signed_up", "bus": "jobs"}
        )
        self.ordered: type[Event] = type(
            "Ordered", (Event,), {"name": f"{prefix}.order.placed", "bus": "jobs"}
        )
        self.welcome = self.listener("welcome", self.signed)
        self.audit = self.listener("audit", f"{prefix}.>")
        self.workers: list[ListenerRunner] = []
        self.seen: list[dict[str, Any]] = []
        self.bus = EventBus(ctx, "jobs")

    def listener(self, name: str, event: Any) -> type[Listener]:
        attributes = {"event": event, "group": f"{self.prefix}-{name}", "bus": "jobs"}
        return type(name, (Recorder,), attributes)

    async def start(self, *listeners: type[Listener]) -> ListenerRunner:
        worker = ListenerRunner(self.ctx)
        for listener in listeners:
            worker.register(listener)
        for name in ("start", "done", "retry", "fail", "dlq"):
            worker.on(name, self.seen.append)
        await worker.start()
        self.workers.append(worker)
        return worker

    def signals(self, group: type[Listener], event_id: str) -> list[tuple[str, int | None]]:
        return [
            (s["signal"], s.get("attempt") or s.get("attempts"))
            for s in self.seen
            if s["id"] == event_id and s["group"] == group.group
        ]


@pytest.fixture(params=CONTRACT_DRIVERS)
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> AsyncIterator[Setup]:
    body = bus_body(request)
    redis_url = config_redis_url(request, redis_url)
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    ctx = await boot(config, role="test", database=False)
    found = Setup(ctx, prefix, driver_of(request.param))
    assert found.bus.bus.driver == found.driver
    yield found
    for worker in found.workers:
        await worker.stop(5)
    await shutdown(ctx)


async def test_every_group_runs_every_event_once(setup: Setup) -> None:
    await setup.start(setup.welcome, setup.audit)
    ids = [await setup.bus.emit(setup.signed, {"n": n}) for n in range(5)]
    other = await setup.bus.emit(setup.ordered, {"n": 5})
    await until(lambda: sum(RUNS[(setup.audit.group, i)] for i in [*ids, other]) == 6, "audit")
    await until(lambda: sum(RUNS[(setup.welcome.group, i)] for i in ids) == 5, "welcome")
    await asyncio.sleep(0.2)
    assert [RUNS[(setup.welcome.group, i)] for i in ids] == [1] * 5
    assert RUNS[(setup.welcome.group, other)] == 0  # not its event
    assert setup.signals(setup.welcome, ids[0]) == [("start", 1), ("done", 1)]


async def test_a_failure_is_retried_in_its_group_only(setup: Setup) -> None:
    await setup.start(setup.welcome, setup.audit)
    flaky = setup.listener("flaky", setup.signed)
    await setup.start(flaky)
    event_id = await setup.bus.emit(setup.signed, {"fail_first": 1})
    await until(lambda: len(setup.signals(flaky, event_id)) == 4, "flaky done")
    assert setup.signals(flaky, event_id) == [("start", 1), ("retry", 1), ("start", 2), ("done", 2)]
    # Every group fails its first run, retries once, and no group runs a third time.
    await until(lambda: RUNS[(setup.welcome.group, event_id)] == 2, "welcome retried")
    await asyncio.sleep(0.2)
    assert ATTEMPTS[(setup.welcome.group, event_id)] == [1, 2]
    assert ATTEMPTS[(setup.audit.group, event_id)] == [1, 2]


async def test_retries_plus_one_then_the_dlq_and_a_requeue_for_that_group(setup: Setup) -> None:
    doomed = setup.listener("doomed", setup.signed)
    await setup.start(doomed, setup.audit)
    event_id = await setup.bus.emit(setup.signed, {"fail_first": 3}, id=f"{setup.prefix}-e1")
    await until(lambda: ("dlq", 3) in setup.signals(doomed, event_id), "dlq")
    assert [s for s, _ in setup.signals(doomed, event_id)] == [
        "start",
        "retry",
        "start",
        "retry",
        "start",
        "fail",
        "dlq",
    ]
    await until(lambda: ATTEMPTS.get((setup.audit.group, event_id)) == [1, 2, 3], "audit dead")
    dlq = setup.bus.dlq
    assert await dlq.count(doomed) == 1
    [record] = await dlq.list(doomed)
    assert (record["id"], record["attempts"]) == (event_id, 3)
    assert record["subject"] == f"{setup.prefix}.user.signed_up"  # the event name
    assert record["payload"] == {"fail_first": 3}
    assert record["error"] == {"type": "RuntimeError", "message": "planned failure 3"}
    assert (await setup.bus.stats(doomed)).dlq == 1
    # Requeued, it reaches the doomed group only, its attempts starting again at 1.
    assert await dlq.requeue(doomed, event_id) == 1
    await until(lambda: RUNS[(doomed.group, event_id)] == 4, "requeued run")
    await asyncio.sleep(0.3)
    assert ATTEMPTS[(doomed.group, event_id)] == [1, 2, 3, 1]
    assert RUNS[(setup.audit.group, event_id)] == 3
    assert await dlq.count(doomed) == 0
    assert await dlq.purge(setup.audit) == 1 and await dlq.count(setup.audit) == 0


async def test_a_timeout_fails_an_attempt_and_permanent_skips_the_retries(setup: Setup) -> None:
    attributes = {"event": setup.signed, "group": f"{setup.prefix}-limited", "bus": "jobs"}
    limited: type[Limited] = type("limited", (Limited,), attributes)
    await setup.start(limited)
    hung = await setup.bus.emit(setup.signed, {"sleep_s": 30})
    gone = await setup.bus.emit(setup.signed, {"permanent": "ada"})
    await until(lambda: ("dlq", 3) in setup.signals(limited, hung), "the hung one dead")
    await until(lambda: ("dlq", 1) in setup.signals(limited, gone), "the permanent one dead")
    records = {r["id"]: r for r in await setup.bus.dlq.list(limited)}
    assert (records[hung]["error"]["type"], records[hung]["attempts"]) == ("JobTimeout", 3)
    assert "longer than its timeout_s (0.3 s)" in records[hung]["error"]["message"]
    assert (records[gone]["error"]["type"], records[gone]["attempts"]) == ("Permanent", 1)
    assert (RUNS[(limited.group, hung)], RUNS[(limited.group, gone)]) == (3, 1)
    assert [s for s, _ in setup.signals(limited, gone)] == ["start", "fail", "dlq"]


async def test_an_id_is_a_dedup_key(setup: Setup) -> None:
    await setup.start(setup.welcome)
    key = f"{setup.prefix}-once"
    assert await setup.bus.emit(setup.signed, {}, id=key) == key
    assert await setup.bus.emit(setup.signed, {}, id=key) == key
    await until(lambda: RUNS[(setup.welcome.group, key)] == 1, "run")
    await asyncio.sleep(0.3)
    assert RUNS[(setup.welcome.group, key)] == 1


async def test_a_new_group_replays_the_kept_events(setup: Setup) -> None:
    first = await setup.bus.emit(setup.signed, {})
    await setup.bus.emit(setup.ordered, {})
    await setup.start(setup.welcome)
    await until(lambda: RUNS[(setup.welcome.group, first)] == 1, "replayed")
    assert (await setup.bus.stats(setup.welcome)).dlq == 0


async def test_stop_drains_running_listeners(setup: Setup) -> None:
    worker = await setup.start(setup.welcome)
    event_id = await setup.bus.emit(setup.signed, {"sleep_s": 0.5})
    await until(lambda: RUNS[(setup.welcome.group, event_id)] == 1, "started")
    await worker.stop(5)
    assert setup.signals(setup.welcome, event_id) == [("start", 1), ("done", 1)]


class Enqueuer(Listener):
    """Enqueues the Job class named by its `job` attribute, with the event's id as its id."""

    job: Any = None

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        await JobQueue(ctx, "jobs").enqueue(self.job, {}, id=f"j{event.id}")


async def test_a_job_enqueued_by_a_listener_names_the_event_as_its_cause(setup: Setup) -> None:
    job: type[Job] = type(
        "Welcomed",
        (Job,),
        {
            "subject": f"{setup.prefix}.welcomed",
            "bus": "jobs",
            "run": lambda self, payload, ctx: None,
        },
    )
    enqueuer: type[Enqueuer] = type(
        "enqueuer",
        (Enqueuer,),
        {
            "event": setup.signed,
            "group": f"{setup.prefix}-enqueuer",
            "bus": "jobs",
            "job": job,
        },
    )
    await setup.start(enqueuer)
    queue = JobQueue(setup.ctx, "jobs")
    event_id = await setup.bus.emit(setup.signed, {})
    await until(lambda: setup.signals(enqueuer, event_id) == [("start", 1), ("done", 1)], "ran")
    status = await queue.status(job, f"j{event_id}")
    assert status is not None and status.state == "queued"
    assert status.cause == Cause(
        kind="event", name=setup.signed.name, id=event_id, group=enqueuer.group
    )
    await queue.enqueue(job, {}, id="by-hand")
    by_hand = await queue.status(job, "by-hand")
    assert by_hand is not None and by_hand.cause is None  # enqueued outside any run


async def test_a_groups_stats_and_its_consume_loops_seen(setup: Setup) -> None:
    """The oldest event a group has not settled, what its lane stored, and its loops. On
    redis a group reads the whole log (it cannot filter), so its oldest is the log's: any
    test's event, at least as old as these."""
    welcome, bus = setup.welcome, setup.bus
    before = await bus.stats(welcome)  # the group exists from here on: it gets what follows
    assert await bus.workers(welcome) == []
    first_ms = int(time.time() * 1000)
    ids = [await bus.emit(setup.signed, {"n": n}) for n in range(3)]
    waiting = await bus.stats(welcome)
    assert waiting.pending >= 3 and waiting.oldest_ms is not None
    assert waiting.oldest_ms <= int(time.time() * 1000)
    if setup.driver != "redis":
        assert waiting.oldest_ms >= first_ms

    await setup.start(welcome)
    await until(lambda: all(RUNS[(welcome.group, i)] == 1 for i in ids), "all 3 run")

    async def seen() -> bool:
        return [w.worker for w in await bus.workers(welcome)] == [setup.ctx.instance_id]

    await until(seen, "its consume loop seen")

    async def settled() -> bool:
        now = await bus.stats(welcome)
        return (now.in_flight, now.oldest_ms) == (0, None)

    if setup.driver != "redis":  # there the shared log may get any test's events meanwhile
        await until(settled, "nothing left unsettled")
    assert (await bus.stats(welcome)).stored - before.stored >= 3


async def test_a_poison_event_costs_one_delivery_never_the_lane(setup: Setup) -> None:
    """An event whose id no check let through (5,000 characters, published straight into the
    engine, as an older or foreign producer could) heard by a listener that fails: it is
    dead-lettered under a stand-in id with a record that says why, never run, and the
    process goes on: the events after it and 100 jobs on the same connection all run."""
    doomed = setup.listener("doomed", setup.signed)
    await setup.start(doomed)
    poison_id = "p" * 5000
    poison = Message(poison_id, setup.signed.name, b'{"fail_first": 9}', int(time.time() * 1000))
    await setup.bus.publish_many([poison])
    run = lambda self, payload, ctx: AFTER.add(payload["n"])  # noqa: E731
    job: type[Job] = type(
        "After", (Job,), {"subject": f"{setup.prefix}.after", "bus": "jobs", "run": run}
    )
    jobs = JobRunner(setup.ctx)
    jobs.register(job)
    await jobs.start()
    try:
        queue = jobs.queue("jobs")
        await until(lambda: setup.bus.dlq.count(doomed), "the poison dead-lettered", 30)
        [record] = await setup.bus.dlq.list(doomed)
        assert record["id"] == stand_in_id(poison_id)
        assert record["error"]["type"] == "InvalidId"
        assert "(5,000 characters)" in record["error"]["message"]
        assert record["attempts"] == 0 and not any(key[1] == poison_id for key in RUNS)
        after = await setup.bus.emit(setup.signed, {})
        for n in range(100):
            await queue.enqueue(job, {"n": f"{setup.prefix}-{n}"})
        await until(lambda: RUNS[(doomed.group, after)] == 1, "the next event ran", 30)
        await until(
            lambda: sum(f"{setup.prefix}-{n}" in AFTER for n in range(100)) == 100,
            "100 jobs after the poison",
            30,
        )
    finally:
        await jobs.stop(5)
