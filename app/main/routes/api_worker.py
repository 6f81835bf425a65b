"""JSON for the CPU worker demo: the hash in the pool (or inline) and the heartbeat ping."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from app.mega.web.auth import UserDep
from app.mega.web.envelope import ok

router = APIRouter(prefix="/api/demo")


@router.get("/ping")
async def ping(user: UserDep) -> Response:
    """The browser's heartbeat: answers at once unless something blocks the event loop."""
    return ok({"ts": int(time.time() * 1000)})
