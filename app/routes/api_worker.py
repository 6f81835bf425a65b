"""JSON for the CPU worker demo: the hash in the pool (or inline) and the heartbeat ping.

`inline: true` runs the same hash on the web event loop, on purpose: every other request,
the page's heartbeat included, waits until it is done. That is the stall the pool avoids.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from app.workers.hash_tasks import MAX_ROUNDS, sha256_loop
from mega.web import ApiError, UserDep, api_responses, ok

router = APIRouter(prefix="/api/demo")
POOL = "hash"
# A run past this is killed (its process replaced): MAX_ROUNDS takes ~15 s here.
HASH_TIMEOUT_MS = 60_000
# Inline runs stall every request of the server: a few seconds of hashing at most here.
MAX_INLINE_ROUNDS = 8_000_000


class HashRequest(BaseModel):
    input: Annotated[str, Field(max_length=1000)] = "mega"
    rounds: Annotated[int, Field(ge=1, le=MAX_ROUNDS, strict=True)] = 1_000_000
    inline: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="after")
    def inline_is_capped(self) -> HashRequest:
        if self.inline and self.rounds > MAX_INLINE_ROUNDS:
            raise PydanticCustomError(
                "inline_cap",
                "inline runs stall every user: at most {cap} rounds (the pool takes more)",
                {"cap": f"{MAX_INLINE_ROUNDS:,}"},
            )
        return self


class InlineGate:
    """One inline run at a time, with a pause after it as long as it took: the requests that
    queued up behind a stalled loop are refused (429) instead of stalling it again in turn."""

    def __init__(self) -> None:
        self.busy_until = 0.0

    def check(self) -> None:
        wait_s = self.busy_until - time.monotonic()
        if wait_s > 0:
            raise ApiError(
                429, "rate_limited",
                "an inline run just stalled the server; try again in a moment (or use the pool)",
                headers={"Retry-After": str(max(1, round(wait_s)))},
            )  # fmt: skip

    def ran(self, seconds: float) -> None:
        self.busy_until = time.monotonic() + seconds


def inline_hash(request: Request, task: dict[str, Any]) -> dict[str, Any]:
    """The same hash on the event loop, on purpose (the contrast), behind the gate."""
    gate: InlineGate = request.app.state.__dict__.setdefault("inline_gate", InlineGate())
    gate.check()
    started = time.perf_counter()
    try:
        result: dict[str, Any] = sha256_loop(task)  # blocks the event loop: the stall it shows
    finally:
        gate.ran(time.perf_counter() - started)
    return result


@router.post("/worker/hash", responses=api_responses(errors=(401, 403, 422, 429, 500, 503, 504)))
async def run_hash(body: HashRequest, request: Request, user: UserDep) -> Response:
    task = {"input": body.input, "rounds": body.rounds}
    mode: Literal["pool", "inline"] = "inline" if body.inline else "pool"
    started = time.perf_counter()
    if body.inline:
        result = inline_hash(request, task)
    else:
        result = await request.app.state.ctx.workers[POOL].run(
            "sha256_loop", task, timeout_ms=HASH_TIMEOUT_MS
        )
    ms = round((time.perf_counter() - started) * 1000, 1)
    return ok({**result, "ms": ms, "mode": mode})


@router.get("/worker", responses=api_responses(errors=(401,)))
async def pool_state(request: Request, user: UserDep) -> Response:
    return ok(request.app.state.ctx.workers[POOL].stats())


@router.get("/ping", responses=api_responses(errors=(401,)))
async def ping(user: UserDep) -> Response:
    """The browser's heartbeat: answers at once unless something blocks the event loop."""
    return ok({"ts": int(time.time() * 1000)})
