"""/healthz (the process answers), /readyz (its dependencies answer), /metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import APIRouter, Request, Response

from mega.constants import READY_CHECK_TIMEOUT_S
from mega.context import Context
from mega.web.envelope import fail, ok

router = APIRouter()


@router.api_route("/healthz", methods=["GET", "HEAD"], include_in_schema=False)
async def healthz() -> Response:
    return ok({"status": "alive"})


@router.api_route("/readyz", methods=["GET", "HEAD"], include_in_schema=False)
async def readyz(request: Request) -> Response:
    checks = await readiness(request.app.state.ctx)
    down = {name: state for name, state in checks.items() if state != "ok"}
    if down:
        message = "not ready: " + "; ".join(f"{name} {state}" for name, state in down.items())
        return fail(503, "dependency.unavailable", message, checks=checks)
    return ok({"status": "ready", "checks": checks})


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text, when `metrics.enabled` and `metrics.web`; with `metrics.token`, only for
    a scrape that sends it as a bearer token (compared in constant time)."""
    config = request.app.state.config.metrics
    if not (config.enabled and config.web):
        return fail(404, "not_found", "metrics are off here; see metrics = {...} in the config")
    if config.token is not None:
        sent = request.headers.get("authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {config.token}".encode()):
            return fail(
                401,
                "unauthorized",
                "send the metrics token: Authorization: Bearer <token>",
                headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
            )
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    # On a thread: collectors that read a bus (the queue depths) wait there for the loop.
    return Response(await asyncio.to_thread(generate_latest), media_type=CONTENT_TYPE_LATEST)


async def readiness(ctx: Context) -> dict[str, str]:
    """Probe every dependency concurrently; each answers "ok" or "down: <reason>"."""
    probes: dict[str, Any] = {}
    for alias, cache in ctx.caches.items():
        probes[f"redis:{alias}"] = cache.native.ping()
    for alias, bus in ctx.buses.items():
        probes[f"{bus.driver}:{alias}"] = bus.ping()
    if ctx.database is not None:
        probes["db"] = asyncio.to_thread(ctx.database.ping)
    for name, pool in ctx.workers.items():
        probes[f"worker:{name}"] = _pool_probe(pool)
    results = await asyncio.gather(
        *(asyncio.wait_for(probe, READY_CHECK_TIMEOUT_S) for probe in probes.values()),
        return_exceptions=True,
    )
    return {
        name: "ok" if not isinstance(result, BaseException) else f"down: {_why(result)}"
        for name, result in zip(probes, results, strict=True)
    }


async def _pool_probe(pool: Any) -> None:
    if pool.stats().get("broken"):
        raise RuntimeError("pool is broken (too many crashes); restart the host")


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "no answer"
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")
