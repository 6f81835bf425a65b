"""Two middlewares, as the jobs chapter shows them: a run's timing, and a tenant's context.

    .venv/bin/python docs/guide/examples/middlewares.py    # a job through both, in memory

In an application, list them in the config: `middlewares = [Timing(), tenant_scope]`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import Any

from mega import CallNext, Context, Job, Run
from mega.testing import drain, memory_context

log = logging.getLogger("app.timing")
TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


class Timing:
    """How long each run took, and how it ended: a class, so it can hold settings."""

    def __init__(self, slow_s: float = 1.0) -> None:
        self.slow_s = slow_s

    async def __call__(self, run: Run, call_next: CallNext) -> Any:
        started = time.perf_counter()
        outcome = "failed"
        try:
            result = await call_next(run)
            outcome = "done"
            return result
        finally:
            took = time.perf_counter() - started
            level = logging.WARNING if took > self.slow_s else logging.INFO
            log.log(level, "%s %s attempt %d %s in %.3f s", run.name, run.id, run.attempt,
                    outcome, took)  # fmt: skip


async def tenant_scope(run: Run, call_next: CallNext) -> Any:
    """The run's tenant (its key) in a context variable, for the code the job calls."""
    token = TENANT.set(run.key)
    try:
        return await call_next(run)
    finally:
        TENANT.reset(token)


class Invoice(Job):
    subject = "billing.invoice"
    bus = "jobs"
    keep_result_s = 60

    async def run(self, payload: dict[str, Any], ctx: Context) -> str:
        return f"invoice {payload['number']} for {TENANT.get()}"


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ctx = memory_context(middlewares=[Timing(slow_s=0.5), tenant_scope])
    job_id = await Invoice.enqueue(ctx, {"number": 7}, key="acme")
    await drain(ctx, jobs=[Invoice])
    print(await Invoice.result(ctx, job_id))


if __name__ == "__main__":
    asyncio.run(main())
