"""JSON for the CPU worker demo: the hash in the pool (or inline) and the heartbeat ping.

`inline: true` runs the same hash on the web event loop, on purpose: every other request,
the page's heartbeat included, waits until it is done. That is the stall the pool avoids.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from app.workers.hash_tasks import MAX_ROUNDS, sha256_loop
from mega.web import UserDep, ok

router = APIRouter(prefix="/api/demo")
POOL = "hash"
# A run past this is killed (its process replaced): MAX_ROUNDS takes ~15 s here.
HASH_TIMEOUT_MS = 60_000


class HashRequest(BaseModel):
    input: Annotated[str, Field(max_length=1000)] = "mega"
    rounds: Annotated[int, Field(ge=1, le=MAX_ROUNDS, strict=True)] = 1_000_000
    inline: Annotated[bool, Field(strict=True)] = False


@router.post("/worker/hash")
async def run_hash(body: HashRequest, request: Request, user: UserDep) -> Response:
    task = {"input": body.input, "rounds": body.rounds}
    mode: Literal["pool", "inline"] = "inline" if body.inline else "pool"
    started = time.perf_counter()
    if body.inline:
        result = sha256_loop(task)  # blocks the event loop: the contrast the page shows
    else:
        result = await request.app.state.ctx.workers[POOL].run(
            "sha256_loop", task, timeout_ms=HASH_TIMEOUT_MS
        )
    ms = round((time.perf_counter() - started) * 1000, 1)
    return ok({**result, "ms": ms, "mode": mode})


@router.get("/worker")
async def pool_state(request: Request, user: UserDep) -> Response:
    return ok(request.app.state.ctx.workers[POOL].stats())


@router.get("/ping")
async def ping(user: UserDep) -> Response:
    """The browser's heartbeat: answers at once unless something blocks the event loop."""
    return ok({"ts": int(time.time() * 1000)})
