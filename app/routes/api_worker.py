"""JSON for the CPU worker demo: the hash in the pool (or inline), its progress, the heartbeat
ping, and the failure modes a learner provokes: a timeout, a killed child, a burst past the queue.

`inline: true` runs the same hash on the web event loop, on purpose: every other request,
the page's heartbeat included, waits until it is done. That is the stall the pool avoids.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from app.deps import hash_pool, pool_log
from app.workers.hash_rates import HashRates, Mode
from app.workers.hash_tasks import MAX_ROUNDS, sha256_loop
from app.workers.run_progress import RunProgress
from mega.errors import WorkerError, WorkerOverloaded
from mega.web import (
    ApiError,
    UserDep,
    WholeNumber,
    api_responses,
    field_errors,
    flash,
    form_number,
    ok,
    provided,
    render,
)

logger = logging.getLogger("app.worker")
router = APIRouter()
# A run past this is killed (its process replaced): MAX_ROUNDS takes ~15 s here. A request may
# ask for less with `timeout_ms`, which is how the page shows worker.task_timeout.
HASH_TIMEOUT_MS = 60_000
# Inline runs stall every request of the server: a few seconds of hashing at most here.
MAX_INLINE_ROUNDS = 8_000_000
DIGEST_PATTERN = r"^[0-9a-f]{64}$"  # a result the page shows after a form post
# A run id: what the browser generates (crypto.randomUUID() or similar), nothing else.
RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
# The burst sends this many runs more than the pool can hold (pool_size + max_queue) ...
BURST_EXTRA_RUNS = 4
# ... of this many rounds each (~0.3 s each here): long enough that the queue is still full
# when the page sends its own run just after, short enough that the burst drains in seconds.
BURST_ROUNDS = 1_000_000

RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN, description="a short id made by the page")]


class HashRequest(BaseModel):
    input: Annotated[str, Field(max_length=1000)] = "mega"
    # Before rounds and timeout_ms: their validators below read it.
    inline: Annotated[bool, Field(strict=True)] = False
    rounds: Annotated[int, WholeNumber(1, MAX_ROUNDS)] = 1_000_000
    timeout_ms: Annotated[int, WholeNumber(1, HASH_TIMEOUT_MS, unit="milliseconds")] | None = None
    run_id: RunId | None = None

    @field_validator("rounds")
    @classmethod
    def inline_is_capped(cls, rounds: int, info: ValidationInfo) -> int:
        if info.data.get("inline") and rounds > MAX_INLINE_ROUNDS:
            raise PydanticCustomError(
                "inline_cap",
                "must be a whole number from 1 to {cap} for an inline run, which stalls "
                "every user (the pool takes up to {most})",
                {"cap": MAX_INLINE_ROUNDS, "most": MAX_ROUNDS},
            )
        return rounds

    @field_validator("timeout_ms")
    @classmethod
    def pool_only(cls, timeout_ms: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("inline") and timeout_ms is not None:
            raise PydanticCustomError(
                "inline_timeout",
                "must be empty for an inline run: nothing can interrupt the event loop while "
                "it hashes (that is what the pool's separate processes are for)",
            )
        return timeout_ms


class HashResult(BaseModel):
    digest: str
    rounds: int
    ms: float  # wall time of the request's run, queueing included
    mode: Literal["pool", "inline"]


class RunFigure(BaseModel):
    fraction: float  # 0..1, the rounds done so far
    note: str | None  # e.g. "1,200,000 of 6,000,000 rounds"


class RoundsRate(BaseModel):
    rounds_per_s: int
    runs: int  # the last runs it is measured over


class PoolLogLine(BaseModel):
    at: str  # HH:MM:SS, UTC
    text: str  # e.g. "child 13236 killed, replaced by 13301 in 0.3 s"
    pid: int  # the child that exited
    new_pid: int  # the one started in its place
    reason: Literal["killed", "timeout", "crashed"]
    ms: float  # how long the pool ran one child short


class PoolState(BaseModel):
    busy: int
    queued: int
    size: int  # live processes
    restarts: int  # crash replacements so far (a timeout's kill is not counted)
    broken: bool
    pool_size: int
    max_queue: int
    max_restarts: int
    mode: str
    pool_rate: RoundsRate | None  # None until a pool run of 100,000 rounds or more finished
    inline_rate: RoundsRate | None
    rate_text: str  # what the page says of both
    log: list[PoolLogLine]  # the pool's last replacements, newest first


class Killed(BaseModel):
    killed_pid: int | None  # None: no child to kill right now


class BurstOutcome(BaseModel):
    sent: int
    accepted: int  # taken by the pool: running or queued
    refused: int  # worker.overloaded: what POST /api/demo/worker/hash answers with 429
    retry_after_s: int | None  # the pool's estimate, as in the 429's Retry-After
    failed: list[str]  # codes of runs refused for another reason (a broken pool)
    capacity: int  # pool_size + max_queue


class InlineGate:
    """One inline run at a time, with a pause after it as long as it took: the requests that
    queued up behind a stalled loop are refused (429) instead of stalling it again in turn."""

    def __init__(self) -> None:
        self.busy_until = 0.0

    def check(self) -> None:
        wait_s = self.busy_until - time.monotonic()
        if wait_s > 0:
            raise ApiError(
                429,
                "rate_limited",
                "an inline run just stalled the server; try again in a moment (or use the pool)",
                headers={"Retry-After": str(max(1, round(wait_s)))},
            )

    def ran(self, seconds: float) -> None:
        self.busy_until = time.monotonic() + seconds


class BurstRuns(set[asyncio.Task[Any]]):
    """The burst's accepted runs, referenced until done (then forgotten)."""


# The app's own objects, each made on first use and kept for the app's life.
inline_gate = provided(InlineGate, default=InlineGate)
hash_rates = provided(HashRates, default=HashRates)
run_progress = provided(RunProgress, default=RunProgress)
burst_runs = provided(BurstRuns, default=BurstRuns)


def inline_hash(request: Request, task: dict[str, Any]) -> dict[str, Any]:
    """The same hash on the event loop, on purpose (the contrast), behind the gate."""
    gate = inline_gate(request)
    gate.check()
    started = time.perf_counter()
    try:
        result: dict[str, Any] = sha256_loop(task)  # blocks the event loop: the stall it shows
    finally:
        gate.ran(time.perf_counter() - started)
    return result


def timed_run(request: Request, mode: Mode, rounds: int, started: float) -> float:
    """The run's wall time in ms (what the result card shows), counted in the measured rate."""
    seconds = time.perf_counter() - started
    hash_rates(request).record(mode, rounds, seconds)
    return round(seconds * 1000, 1)


async def pool_hash(
    request: Request, task: dict[str, Any], timeout_ms: int | None, run_id: str | None
) -> dict[str, Any]:
    """The hash in the pool; with a run id, its rounds done are readable at /worker/progress."""
    pool = hash_pool(request)
    timeout = timeout_ms or HASH_TIMEOUT_MS
    if run_id is None:
        result: dict[str, Any] = await pool.run("sha256_loop", task, timeout_ms=timeout)
        return result
    board = run_progress(request)
    board.start(run_id)

    def on_progress(fraction: float, note: str | None) -> None:
        board.update(run_id, fraction, note)

    try:
        result = await pool.run("sha256_loop", task, timeout_ms=timeout, on_progress=on_progress)
    finally:
        board.end(run_id)
    return result


HASH_ERRORS = (401, 403, 422, 429, 500, 503, 504)


@router.post("/api/demo/worker/hash", responses=api_responses(HashResult, errors=HASH_ERRORS))
async def run_hash(body: HashRequest, request: Request, user: UserDep) -> Response:
    """The hash; past `timeout_ms` (pool only) the child is killed: 504 worker.task_timeout."""
    task = {"input": body.input, "rounds": body.rounds}
    mode: Literal["pool", "inline"] = "inline" if body.inline else "pool"
    started = time.perf_counter()
    if body.inline:
        result = inline_hash(request, task)
    else:
        result = await pool_hash(request, task, body.timeout_ms, body.run_id)
    ms = timed_run(request, mode, body.rounds, started)
    return ok({**result, "ms": ms, "mode": mode})


@router.get(
    "/api/demo/worker/progress", responses=api_responses(RunFigure | None, errors=(401, 422))
)
async def hash_progress(
    request: Request, user: UserDep, run_id: Annotated[str, Query(pattern=RUN_ID_PATTERN)]
) -> Response:
    """`{fraction, note}` of a pool run in flight in this web process, or null."""
    return ok(run_progress(request).get(run_id))


def page_rounds(request: Request) -> int:
    """The page's default rounds: about 2 s of hashing on this machine as measured (an inline
    run of them stalls the server that long), within the inline cap."""
    return hash_rates(request).page_rounds(sha256_loop, MAX_INLINE_ROUNDS)


def pool_state(request: Request) -> dict[str, Any]:
    """The pool panel: stats() and the settings they are measured against, the rate the last
    runs hashed at, and the pool's last replacements."""
    pool = hash_pool(request)
    settings = pool.settings
    rates = hash_rates(request)
    return {
        **pool.stats(),
        "pool_size": settings.pool_size,
        "max_queue": settings.max_queue,
        "max_restarts": settings.max_restarts,
        "mode": settings.mode,
        "pool_rate": rates.rate("pool"),
        "inline_rate": rates.rate("inline"),
        "rate_text": rates.text(page_rounds(request)),
        "log": pool_log(request).lines(),
    }


@router.get("/api/demo/worker", responses=api_responses(PoolState, errors=(401,)))
async def get_pool_state(request: Request, user: UserDep) -> Response:
    return ok(pool_state(request))


@router.post("/api/demo/worker/kill", responses=api_responses(Killed, errors=(401, 403, 409)))
async def kill_child(request: Request, user: UserDep) -> Response:
    """SIGKILL one pool child (a busy one first): the pool replaces it and counts a restart.
    Refused (409) when the pool has no restart left: a shared demo must not break its pool."""
    return ok({"killed_pid": kill_one(request)})


def kill_one(request: Request) -> int | None:
    pool = hash_pool(request)
    state = pool_state(request)
    if state["restarts"] >= state["max_restarts"]:
        raise ApiError(
            409,
            "worker.no_restarts_left",
            f"the pool has used all {state['max_restarts']} of its restarts: one more crash "
            "would break it (every run would fail with worker.crashed until the app restarts), "
            "so this demo does not kill another child",
        )
    pid: int | None = pool.kill_one()
    return pid


@router.post("/api/demo/worker/burst", responses=api_responses(BurstOutcome, errors=(401, 403)))
async def burst(request: Request, user: UserDep) -> Response:
    """Send pool_size + max_queue + BURST_EXTRA_RUNS hash runs at once, from the server (a
    browser opens at most 6 connections to a host: too few to fill the queue). The pool takes
    what it can hold; the rest fail at once with worker.overloaded, which POST /worker/hash
    answers with 429 and Retry-After. The accepted runs go on after this answers."""
    return ok(await send_burst(request))


async def send_burst(request: Request) -> dict[str, Any]:
    pool = hash_pool(request)
    settings = pool.settings
    capacity = settings.pool_size + settings.max_queue
    task = {"input": "burst", "rounds": BURST_ROUNDS}
    runs = [
        asyncio.create_task(pool.run("sha256_loop", task))
        for _ in range(capacity + BURST_EXTRA_RUNS)
    ]
    # A full queue refuses inside run() itself, before its first await: the refused runs are
    # done after one turn of the loop, the accepted ones are still waiting for the pool.
    done, pending = await asyncio.wait(runs, timeout=0.05)
    errors = [error for run in done if (error := run.exception()) is not None]
    refused = [error for error in errors if isinstance(error, WorkerOverloaded)]
    failed = [error for error in errors if not isinstance(error, WorkerOverloaded)]
    keep = burst_runs(request)
    for run in pending:
        keep.add(run)  # referenced until done, then forgotten
        run.add_done_callback(functools.partial(_forget, keep))
    return {
        "sent": len(runs),
        "accepted": len(runs) - len(errors),
        "refused": len(refused),
        "retry_after_s": max((error.retry_after_s for error in refused), default=None),
        "failed": sorted(getattr(error, "code", type(error).__name__) for error in failed),
        "capacity": capacity,
    }


def _forget(keep: BurstRuns, run: asyncio.Task[Any]) -> None:
    keep.discard(run)
    if not run.cancelled() and run.exception() is not None:
        logger.info("a burst run ended with %s", run.exception())


@router.get("/api/demo/ping", responses=api_responses(errors=(401,)))
async def ping(user: UserDep) -> Response:
    """The browser's heartbeat: answers at once unless something blocks the event loop."""
    return ok({"ts": int(time.time() * 1000)})


# -- the same without JavaScript: post, redirect (with a flash), get --------------------------


def worker_page_context(
    request: Request,
    *,
    form: dict[str, Any] | None = None,
    errors: dict[str, str] | None = None,
    result: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What /demo/worker renders: the form (kept on a 422) and its field errors, the result of
    a run posted without JavaScript, and the pool."""
    return {
        "title": "CPU worker",
        "form": form or {"input": "mega", "rounds": str(page_rounds(request)), "timeout_ms": ""},
        "errors": errors or {},
        "page_rounds": page_rounds(request),
        "max_rounds": MAX_ROUNDS,
        "max_timeout_ms": HASH_TIMEOUT_MS,
        "result": result,
        "pool": pool_state(request),
    }


@router.post("/demo/worker/hash", include_in_schema=False)
async def hash_form(request: Request, user: UserDep) -> Response:
    form = await request.form()
    typed = {name: str(form.get(name, "")) for name in ("input", "rounds", "timeout_ms")}
    inline = form.get("mode") == "inline"
    values: dict[str, Any] = {"input": typed["input"], "inline": inline}
    values["rounds"] = form_number(typed["rounds"])
    if typed["timeout_ms"].strip() and not inline:  # the page's timeout field is for pool runs
        values["timeout_ms"] = form_number(typed["timeout_ms"])
    back = RedirectResponse("/demo/worker", status_code=303)
    try:
        body = HashRequest.model_validate(values)
    except ValidationError as exc:
        context = worker_page_context(request, form=typed, errors=field_errors(exc.errors()))
        return render(request, "demo/worker.html", context, status_code=422)
    started = time.perf_counter()
    task = {"input": body.input, "rounds": body.rounds}
    try:
        if inline:
            result = inline_hash(request, task)
        else:
            result = await pool_hash(request, task, body.timeout_ms, None)
    except (ApiError, WorkerError) as exc:
        return flash(request, back, f"Not done: {exc.code}: {exc.message}")
    ms = timed_run(request, "inline" if inline else "pool", body.rounds, started)
    query = urlencode({**result, "ms": ms, "mode": "inline" if inline else "pool"})
    return RedirectResponse(f"/demo/worker?{query}", status_code=303)


@router.post("/demo/worker/kill", include_in_schema=False)
async def kill_form(request: Request, user: UserDep) -> Response:
    back = RedirectResponse("/demo/worker", status_code=303)
    try:
        pid = kill_one(request)
    except ApiError as exc:
        return flash(request, back, f"Not killed: {exc.message}.")
    if pid is None:
        return flash(request, back, "No child process to kill right now.")
    return flash(request, back, f"Killed pool child {pid} (SIGKILL); the pool starts a new one.")


@router.post("/demo/worker/burst", include_in_schema=False)
async def burst_form(request: Request, user: UserDep) -> Response:
    outcome = await send_burst(request)
    return flash(request, RedirectResponse("/demo/worker", status_code=303), burst_text(outcome))


def burst_text(outcome: dict[str, Any]) -> str:
    text = (
        f"Burst: {outcome['sent']} runs sent at once to a pool that holds {outcome['capacity']}; "
        f"{outcome['accepted']} accepted, {outcome['refused']} refused with worker.overloaded "
        "(429 from POST /api/demo/worker/hash)"
    )
    if outcome["retry_after_s"] is not None:
        text += f", Retry-After {outcome['retry_after_s']} s"
    return text + "."
