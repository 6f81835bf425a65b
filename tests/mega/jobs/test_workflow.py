"""Workflows on every bus driver, in this process: a chain hands each result on and stops at a
dead letter, a group's callback runs once with every member's outcome in order, the fan-in
holds when the same ends are reported twice and at once, and bad workflows are refused with
nothing stored. (Worker processes SIGKILLed while members finish: test_workflow_faults.py.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mega import Context, Job, JobQueue, JobRunner, Permanent, chain, group
from mega.config import load_config
from mega.errors import JobError
from mega.jobs.workflow_records import WORKFLOWS, outcome_key, step_id
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.jobs.test_contract import DRIVERS, bus_body, until

RUNS: Counter[str] = Counter()  # job id -> runs
PAYLOADS: dict[str, list[Any]] = {}  # job id -> the payloads its runs received
BROKEN: set[str] = set()  # an Add whose payload's "broken" is in here ends in the DLQ
KEYS: dict[str, str | None] = {}  # job id -> the key its run was enqueued with


class Add(Job):
    """Returns {"n": n + 1}; `fail` in the payload ends it in the DLQ at once."""

    bus = "jobs"
    retries = 0
    concurrency = 8

    async def run(self, payload: dict[str, Any], ctx: Any) -> dict[str, int]:
        RUNS[ctx.job_id] += 1
        PAYLOADS.setdefault(ctx.job_id, []).append(payload)
        KEYS[ctx.job_id] = ctx.key
        await asyncio.sleep(payload.get("sleep_s", 0))
        if "fail" in payload:
            raise Permanent(payload["fail"])
        if payload.get("broken") in BROKEN:
            raise Permanent("broken for now")
        return {"n": payload["n"] + 1}


class Collect(Job):
    """A group's callback: returns how many outcomes it received."""

    bus = "jobs"
    retries = 0

    async def run(self, payload: dict[str, Any], ctx: Any) -> int:
        RUNS[ctx.job_id] += 1
        KEYS[ctx.job_id] = ctx.key
        PAYLOADS.setdefault(ctx.job_id, []).append(payload)
        return len(payload["outcomes"])


class Size(BaseModel):
    px: int


class Sized(Job):
    """No worker consumes it: the fan-in test reports its members' ends by hand."""

    bus = "jobs"
    schema = Size

    async def run(self, size: Size, ctx: Any) -> None:
        raise AssertionError("never consumed")


Jobs = tuple[type[Job], type[Job], type[Job]]


@pytest.fixture(params=DRIVERS)
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> AsyncIterator[tuple[Context, JobQueue, Jobs]]:
    body = bus_body(request)
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    ctx = await boot(config, role="test", database=False)
    jobs = (
        type("Add", (Add,), {"subject": f"{prefix}.add"}),
        type("Collect", (Collect,), {"subject": f"{prefix}.collect"}),
        type("Sized", (Sized,), {"subject": f"{prefix}.sized"}),
    )
    worker = JobRunner(ctx)
    worker.register(jobs[0])
    worker.register(jobs[1])
    await worker.start()
    queue = worker.queue("jobs")
    assert queue.bus.driver == request.param
    yield ctx, queue, jobs
    await worker.stop(5)
    await shutdown(ctx)


async def ended(queue: JobQueue, workflow_id: str) -> Any:
    found = None

    async def final() -> bool:
        nonlocal found
        found = await queue.status(workflow_id)
        return found is not None and found.final

    await until(final, f"workflow {workflow_id} ended")
    return found


async def test_a_chain_hands_each_result_to_the_next_step(setup: Any) -> None:
    ctx, queue, (add, _, _) = setup
    workflow_id = await chain(add.step({"n": 1}), add.step(), add.step()).enqueue(ctx)
    status = await ended(queue, workflow_id)
    ids = [step_id(workflow_id, n) for n in range(3)]
    assert [PAYLOADS[i] for i in ids] == [[{"n": 1}], [{"n": 2}], [{"n": 3}]]
    assert (status.kind, status.state, status.then) == ("chain", "done", None)
    assert [(s.id, s.state, s.result) for s in status.steps] == [
        (ids[0], "done", {"n": 2}),
        (ids[1], "done", {"n": 3}),
        (ids[2], "done", {"n": 4}),
    ]
    assert status.finished_at >= status.created_at
    assert all(RUNS[i] == 1 for i in ids)


async def test_each_step_runs_with_the_key_it_was_given(setup: Any) -> None:
    """A tenant's workflow keeps its fair turns: every step's job, the first and the ones sent
    later (a chain's next step, a group's callback), is enqueued with the step's own key."""
    ctx, queue, (add, collect, _) = setup
    steps = (add.step({"n": 1}, key="acme"), add.step(key="acme"), add.step())
    chained = await chain(*steps).enqueue(ctx)
    members = [add.step({"n": 1}, key="acme"), add.step({"n": 2}, key="globex")]
    grouped = await group(members).then(collect.step(key="acme")).enqueue(ctx)
    await ended(queue, chained)
    await ended(queue, grouped)
    assert [KEYS[step_id(chained, n)] for n in range(3)] == ["acme", "acme", None]
    assert [KEYS[step_id(grouped, n)] for n in range(2)] == ["acme", "globex"]
    assert KEYS[step_id(grouped, "then")] == "acme"


async def test_a_chain_stops_at_a_step_that_ends_in_the_dlq(setup: Any) -> None:
    """A step given a payload gets its own; the one that is dead-lettered stops the chain, and
    the status says where and why."""
    ctx, queue, (add, _, _) = setup
    flow = chain(add.step({"n": 1}), add.step({"n": 10, "fail": "no stock"}), add.step())
    workflow_id = await flow.enqueue(ctx)
    status = await ended(queue, workflow_id)
    assert status.state == "failed"
    assert [s.state for s in status.steps] == ["done", "dlq", "waiting"]
    assert status.steps[1].error.model_dump() == {"type": "Permanent", "message": "no stock"}
    assert PAYLOADS[step_id(workflow_id, 1)] == [{"n": 10, "fail": "no stock"}]

    async def dead_lettered() -> bool:  # a step's end is stored just before its dead letter
        return bool(await queue.dlq.count(add) == 1)

    await until(dead_lettered, "the step's dead letter stored")
    await asyncio.sleep(0.3)  # the last step is never enqueued
    assert RUNS[step_id(workflow_id, 2)] == 0
    assert await queue.status(add, step_id(workflow_id, 2)) is None


async def test_a_requeued_step_that_succeeds_resumes_its_chain(setup: Any, prefix: str) -> None:
    ctx, queue, (add, _, _) = setup
    BROKEN.add(prefix)
    flow = chain(add.step({"n": 1}), add.step({"n": 5, "broken": prefix}), add.step())
    workflow_id = await flow.enqueue(ctx)
    assert (await ended(queue, workflow_id)).state == "failed"
    BROKEN.discard(prefix)
    assert await queue.dlq.requeue(add, step_id(workflow_id, 1)) == 1

    async def done() -> bool:
        status = await queue.status(workflow_id)
        return status is not None and status.state == "done"

    await until(done, "the chain went on")
    status = await queue.status(workflow_id)
    assert [s.result for s in status.steps] == [{"n": 2}, {"n": 6}, {"n": 7}]
    assert [RUNS[step_id(workflow_id, n)] for n in range(3)] == [1, 2, 1]


async def test_a_group_callback_runs_once_with_every_outcome_in_order(
    setup: Any, prefix: str
) -> None:
    ctx, queue, (add, collect, _) = setup
    members = [add.step({"n": n, "sleep_s": 0.05 * (n % 3)}) for n in range(6)]
    members[3] = add.step({"n": 3, "fail": "corrupt image"})
    fan = group(members).then(collect.step({"album": 7}))
    workflow_id = await fan.enqueue(ctx, id=f"{prefix}-album")
    assert workflow_id == f"{prefix}-album" and not workflow_id.duplicate
    status = await ended(queue, workflow_id)
    then = step_id(workflow_id, "then")
    [payload] = PAYLOADS[then]
    assert payload["album"] == 7
    assert payload["outcomes"] == [
        {"id": step_id(workflow_id, n), "job": "Add", "state": "done", "result": {"n": n + 1}}
        if n != 3
        else {
            "id": step_id(workflow_id, 3),
            "job": "Add",
            "state": "dlq",
            "error": {"type": "Permanent", "message": "corrupt image"},
        }
        for n in range(6)
    ]
    assert (status.kind, status.state) == ("group", "done")
    assert [s.state for s in status.steps] == ["done"] * 3 + ["dlq"] + ["done"] * 2
    assert (status.then.id, status.then.state, status.then.result) == (then, "done", 6)
    await asyncio.sleep(0.3)
    assert RUNS[then] == 1


async def test_ends_reported_twice_and_at_once_send_the_callback_once(setup: Any) -> None:
    """The fan-in itself: every member's end reported twice, the two at the same time (two
    workers that both ran it, one after a crash), and once more after the callback ran. The
    first report of each member is the one kept, and the callback is enqueued once."""
    ctx, queue, (_, collect, sized) = setup
    fan = group([sized.step({"px": px}) for px in (64, 128, 256, 512)]).then(collect.step())
    workflow_id = await fan.enqueue(ctx)
    members = [step_id(workflow_id, n) for n in range(4)]
    reports = [
        queue.workflows.ended(member, "done", result=n * 10 + copy)
        for n, member in enumerate(members)
        for copy in (0, 1)
    ]
    await asyncio.gather(*reports)
    then = step_id(workflow_id, "then")
    await until(lambda: RUNS[then] == 1, "the callback ran")
    await queue.workflows.ended(members[0], "done", result=99)
    await asyncio.sleep(0.3)
    assert RUNS[then] == 1
    [payload] = PAYLOADS[then]
    results = [outcome["result"] for outcome in payload["outcomes"]]
    assert [r - r % 10 for r in results] == [0, 10, 20, 30]  # one report of each, not two
    raw = await queue.bus.get_records(WORKFLOWS, "status", [outcome_key(workflow_id, 0)])
    assert b'"result":99' not in raw[0]


async def test_a_step_that_ends_while_its_workflow_is_read_reads_with_its_result(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow's status reads its steps' outcomes, then the job records of those without
    one. A step that ends between the two reads (its outcome stored, then its job's `done`)
    reads as its outcome says, with its result, never `done` without it."""
    ctx, queue, (_, _, sized) = setup
    workflow_id = await group([sized.step({"px": 8}), sized.step({"px": 9})]).enqueue(ctx)
    first, second = step_id(workflow_id, 0), step_id(workflow_id, 1)
    workflows = queue.workflows

    async def first_ends_meanwhile(target: Any, job_ids: list[str]) -> list[Any]:
        assert job_ids == [first, second]  # neither had an outcome at the first read
        await workflows.ended(first, "done", result={"px": 16})
        return [("done", 1), ("queued", 0)]

    monkeypatch.setattr(workflows, "_job_statuses", first_ends_meanwhile)
    status = await queue.status(workflow_id)
    assert [(s.state, s.result) for s in status.steps] == [("done", {"px": 16}), ("queued", None)]


async def test_a_group_without_a_callback_ends_with_its_members(setup: Any) -> None:
    ctx, queue, (add, _, _) = setup
    workflow_id = await group([add.step({"n": n}) for n in range(3)]).enqueue(ctx)
    status = await ended(queue, workflow_id)
    assert (status.state, status.then) == ("done", None)
    assert [s.result for s in status.steps] == [{"n": 1}, {"n": 2}, {"n": 3}]
    failing = await group([add.step({"n": 0}), add.step({"n": 1, "fail": "x"})]).enqueue(ctx)
    assert (await ended(queue, failing)).state == "failed"


async def test_a_workflow_id_is_its_dedup_key(setup: Any, prefix: str) -> None:
    ctx, queue, (add, _, _) = setup
    flow = group([add.step({"n": n}) for n in range(3)])
    first = await flow.enqueue(ctx, id=f"{prefix}-nightly")
    again = await flow.enqueue(ctx, id=f"{prefix}-nightly")
    assert (first.duplicate, again.duplicate) == (False, True)
    await ended(queue, first)
    await asyncio.sleep(0.3)
    assert [RUNS[step_id(first, n)] for n in range(3)] == [1, 1, 1]


async def test_bad_workflows_are_refused_and_store_nothing(setup: Any, prefix: str) -> None:
    ctx, queue, (add, collect, sized) = setup
    refused: dict[str, list[Callable[[], Any]]] = {
        "workflow.invalid_step": [
            lambda: chain(),
            # A name, not a step, on purpose: then() refuses it at run time.
            lambda: group([add.step({"n": 1})]).then("Collect"),  # type: ignore[arg-type]
            lambda: group([add.step({"n": 1})]).then(collect.step([1, 2])).enqueue(ctx),
        ],
        "workflow.invalid_id": [
            lambda: chain(add.step({"n": 1})).enqueue(ctx, id="has space"),
            lambda: chain(add.step({"n": 1})).enqueue(ctx, id="x" * 200),
        ],
        "job.invalid_payload": [
            lambda: chain(add.step({"n": 1}), sized.step({})).enqueue(ctx, id=f"{prefix}-p1"),
            lambda: group([sized.step({"px": 1}), sized.step({})]).enqueue(ctx, id=f"{prefix}-p2"),
        ],
    }
    for code, attempts in refused.items():
        for attempt in attempts:
            with pytest.raises(JobError) as caught:
                result = attempt()
                if asyncio.iscoroutine(result):
                    await result
            assert caught.value.code == code, caught.value
    for refused_id in (f"{prefix}-p1", f"{prefix}-p2"):
        assert await queue.status(refused_id) is None
        assert await queue.status(add, step_id(refused_id, 0)) is None
    assert await queue.status("no-such-workflow") is None
