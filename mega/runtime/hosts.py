"""The three long-running hosts: web (`mega start`), `mega scheduler`, `mega worker`.

All share `boot()`; each registers its part of the config, runs until SIGINT/SIGTERM, drains
gracefully and returns normally (the CLI then exits 0).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mega.config import Config
from mega.constants import DRAIN_TIMEOUT_S, HOW_TO_GET_SERVICES
from mega.context import Context
from mega.errors import DependencyUnavailable, MegaError
from mega.runtime.bootstrap import boot, check_database, shutdown
from mega.runtime.check import enforce
from mega.runtime.logs import observe_signals
from mega.runtime.stopping import StopSignals, stopped_while_starting
from mega.tasks import cancel_and_wait

logger = logging.getLogger("mega.host")


def start_metrics_server(config: Config, port: int) -> None:
    if config.metrics.enabled:
        from prometheus_client import start_http_server

        try:
            start_http_server(port, addr=config.metrics.bind)
        except OSError as exc:
            raise MegaError(
                f"cannot serve metrics on {config.metrics.bind}:{port} ({exc.strerror}); is "
                "another host using that port? Give each host its own (metrics.worker_port, "
                "metrics.scheduler_port), or one per process on one machine",
                code="metrics.port_in_use",
            ) from None
        logger.info("metrics on http://%s:%d/metrics", config.metrics.bind, port)


# A host whose services do not answer at its start tries again after this, doubling each time
# up to the most: a server restarted by its supervisor is picked up within seconds, and a long
# outage costs a connection attempt every half minute.
BOOT_RETRY_FIRST_S = 1.0
BOOT_RETRY_MAX_S = 30.0


@dataclass
class Part:
    """One runtime of a host: what it runs, how it is observed, which hooks it gets.

    `make(ctx, instance_id=...)` builds it; each of `declarations` is `register`ed; `signals`
    are logged (the `routine` ones at DEBUG, counted); `metrics` names the observer of
    mega.runtime.metrics; `hook` the config's hooks key. Parts stop in the order listed."""

    hook: str
    make: Callable[..., Any]
    declarations: list[type]
    signals: tuple[str, ...]
    describe: str  # "{count} job(s): {names}"
    routine: tuple[str, ...] = ()
    metrics: str | None = None


async def run_scheduler(config: Config) -> None:
    """`mega scheduler`: every schedule of `config.schedules`, until SIGINT/SIGTERM."""
    await _run_host(
        config,
        role="scheduler",
        parts=[scheduler_part(config)],
        metrics_port=config.metrics.scheduler_port,
        stopping="stopping (waiting for running ticks)",
    )


def scheduler_part(config: Config) -> Part:
    from mega.schedules.scheduler import Scheduler

    return Part(
        "scheduler",
        Scheduler,
        config.schedules,
        ("run", "skip", "done", "fail"),
        "running {count} schedule(s): {names}",
        metrics="observe_scheduler",
    )


async def run_worker(config: Config, *, apply_limits: bool = False) -> None:
    """`mega worker`: the outbox relay (when the config declares events), every listener group
    of `config.listeners` and every job of `config.jobs`, until SIGINT/SIGTERM; then the relay
    finishes its batch and the listeners and jobs drain. `apply_limits` (or the config's):
    running consumers take the classes' limits instead of only reporting the difference."""
    await _run_host(
        config,
        role="worker",
        parts=worker_parts(config, apply_limits=apply_limits),
        metrics_port=config.metrics.worker_port,
        stopping=f"draining in-flight work (up to {DRAIN_TIMEOUT_S:.0f} s)",
    )


async def run_work(
    config: Config, *, with_scheduler: bool = False, apply_limits: bool = False
) -> None:
    """`mega work`: one process for a small deployment. The scheduler (with `--with-scheduler`
    or `work = {"scheduler": True}`), the outbox relay, the listener groups and the job worker,
    on one event loop. On SIGTERM they stop in that order: no new ticks (claims are left to
    expire), the relay finishes its batch, then listeners and jobs drain, all within one
    DRAIN_TIMEOUT_S."""
    parts = worker_parts(config, apply_limits=apply_limits)
    if with_scheduler or config.work.scheduler:
        parts.insert(0, scheduler_part(config))
    await _run_host(
        config,
        role="work",
        parts=parts,
        metrics_port=config.metrics.worker_port,
        stopping=f"stopping in order: {', '.join(p.hook for p in parts)} "
        f"(up to {DRAIN_TIMEOUT_S:.0f} s in all)",
    )


def relays(config: Config) -> bool:
    """Whether this config's worker hosts run the outbox relay: when it declares events, or
    `outbox.relay` is True (jobs enqueued through the outbox, no events); never when False."""
    return bool(config.outbox.relay or (config.outbox.relay is None and config.events))


def worker_parts(config: Config, *, apply_limits: bool = False) -> list[Part]:
    """What `mega worker` runs, in stop order: relay, listeners, jobs."""
    apply_limits = apply_limits or config.apply_limits
    from mega.jobs.runner import JobRunner

    parts = []
    if relays(config):
        from mega.transactional.relay import OutboxRelay

        def relay(ctx: Context, *, instance_id: str) -> OutboxRelay:
            options = config.outbox
            return OutboxRelay(
                ctx,
                batch=options.batch,
                poll_s=options.poll_s,
                retention_s=options.retention_s,
                paused=options.paused,
                jobs=config.jobs,
            )

        # Its `error` is routine: the relay warns of an outage once (and again only when the
        # error changes), while it retries every second; the count comes every summary.
        parts.append(
            Part(
                "relay",
                relay,
                [],
                ("error",),
                "relaying the outbox",
                routine=("error",),
                metrics="observe_relay",
            )
        )
    if config.listeners:
        from mega.events.runner import ListenerRunner

        parts.append(
            Part(
                "listeners",
                functools.partial(ListenerRunner, apply_limits=apply_limits),
                config.listeners,
                ("start", "done", "retry", "fail", "dlq", "skip"),
                "listening with {count} group(s): {names}",
                routine=("start", "done", "skip"),
                metrics="observe_listeners",
            )
        )
    parts.append(
        Part(
            "worker",
            functools.partial(JobRunner, apply_limits=apply_limits),
            config.jobs,
            ("start", "done", "retry", "fail", "dlq", "cancel"),
            "consuming {count} job(s): {names}",
            routine=("start", "done"),
            metrics="observe_jobs",
        )
    )
    return parts


async def _run_host(
    config: Config, *, role: str, parts: list[Part], metrics_port: int, stopping: str
) -> None:
    """The shared life of the scheduler and worker hosts: boot, register, observe, start,
    wait for a stop signal, stop each part in order with a bounded drain, close connections."""
    enforce(config, logger.warning)  # a bad class is named before any server is reached
    with StopSignals() as signals, stopped_while_starting(signals, role):
        await _host(
            config, signals, role=role, parts=parts, metrics_port=metrics_port, stopping=stopping
        )


async def _host(
    config: Config,
    signals: StopSignals,
    *,
    role: str,
    parts: list[Part],
    metrics_port: int,
    stopping: str,
) -> None:
    ctx = await boot_when_reachable(config, role)
    lost = asyncio.get_running_loop().create_future()
    watch_buses(ctx, functools.partial(settle_lost, lost))
    started: list[Any] = []
    summaries: list[asyncio.Task[None]] = []  # of what the runtimes count themselves
    try:
        if any(part.hook != "scheduler" for part in parts):
            buses = ", ".join(f"{alias!r} on {bus.driver}" for alias, bus in ctx.buses.items())
            logger.info("%s %s buses: %s", role, ctx.instance_id, buses or "none")
        runtimes = []
        for part in parts:
            runtime = part.make(ctx, instance_id=ctx.instance_id)
            for declaration in part.declarations:
                runtime.register(declaration)
            log = observe_signals(
                runtime, part.signals, routine=part.routine, worker=ctx.instance_id
            )
            if log.tallied:
                summaries.append(asyncio.create_task(log.every()))
            if config.metrics.enabled and part.metrics:  # prometheus_client only when on
                getattr(importlib.import_module("mega.runtime.metrics"), part.metrics)(runtime)
            await run_hooks(config, part.hook, runtime, ctx)
            runtimes.append(runtime)
        if config.metrics.enabled:
            metrics = importlib.import_module("mega.runtime.metrics")
            metrics.observe_buses(ctx.buses)
            if any(part.hook == "worker" for part in parts):  # the depth of what it consumes
                metrics.observe_queues(ctx, config.jobs)
        start_metrics_server(config, metrics_port)
        for part, runtime in zip(parts, runtimes, strict=True):
            await runtime.start()
            started.append(runtime)
            names = ", ".join(d.__name__ for d in part.declarations) or "none"
            status = part.describe.format(count=len(part.declarations), names=names)
            logger.info("%s %s %s", role, ctx.instance_id, status)
        freeze_startup_heap()
        stop = signals.running_until_signal()
        await asyncio.wait([stop, lost], return_when=asyncio.FIRST_COMPLETED)
        if stop.done():
            logger.info("%s received: %s", stop.result(), stopping)
    finally:
        await cancel_and_wait(summaries, 1.0)
        # In the parts' order (scheduler, relay, listeners, jobs), within one drain budget.
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for part, runtime in zip(parts, started, strict=False):
            await runtime.stop(max(0.0, deadline - time.monotonic()))
            logger.info("%s stopped", part.hook)
        await shutdown(ctx)
    logger.info("%s stopped", role)
    if lost.done():
        raise lost_for_good(role, lost.result())


async def boot_when_reachable(config: Config, role: str) -> Context:
    """The host's services, connected, and its database checked, tried again with a backoff
    (BOOT_RETRY_FIRST_S doubling to BOOT_RETRY_MAX_S) while one does not answer: a host
    started before its servers (a reboot, a deploy, a node that is down) waits for them, as
    it rides out an outage once running, instead of exiting. A config error still ends it at
    once, and a stop signal ends the wait (exit 0)."""
    delay = BOOT_RETRY_FIRST_S
    while True:
        ctx = None
        try:
            ctx = await boot(config, role=role, database=False)
            await check_database(config.database_url)
            return ctx
        except DependencyUnavailable as exc:
            if ctx is not None:
                await shutdown(ctx)
            reason = exc.message.removesuffix(f"; {HOW_TO_GET_SERVICES}")
            logger.warning(
                "%s waits for its services: %s; trying again in %g s (a server started by "
                "hand or by your supervisor is picked up then; locally, %s)",
                role,
                reason,
                delay,
                HOW_TO_GET_SERVICES,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, BOOT_RETRY_MAX_S)


def watch_buses(ctx: Context, when_lost: Callable[[str], None]) -> None:
    """Call `when_lost(sentence)` when a bus's connection is closed for good: a client that
    will never reconnect (nats-py ends a connection on any -ERR from its server) leaves every
    consume loop on it stuck, and readiness says so from then on (503). The host then stops
    and exits non-zero, for its supervisor (mega dev, compose's restart, systemd) to start
    it again. Drivers whose client reconnects on its own offer no `on_lost`."""
    for alias, bus in ctx.buses.items():
        on_lost = getattr(bus, "on_lost", None)
        if on_lost is not None:
            on_lost(functools.partial(lambda alias, why: when_lost(f"bus {alias!r}: {why}"), alias))


def lost_for_good(role: str, why: str) -> DependencyUnavailable:
    logger.error("%s stopped: its connection to %s is closed for good", role, why)
    return DependencyUnavailable(
        "bus",
        f"{why}: the connection was closed for good, so {role} stopped; started again "
        "(mega dev, compose's restart policy, systemd), it connects anew",
    )


def settle_lost(future: asyncio.Future[str], why: str) -> None:
    """`watch_buses`'s `when_lost` for a host: its first lost bus ends the host's run."""
    if not future.done():
        future.set_result(why)


def freeze_startup_heap() -> None:
    """Take what start-up made (modules, classes, clients, a scheduler's timetable) out of the
    garbage collector's full passes, once a host has started: it lives as long as the process,
    and scanning it again and again stalled the event loop. On a scheduler of 1,000 schedules
    each full pass took about 20 ms, three times a minute, and the ticks due meanwhile started
    that late; with 10,000 schedules the p99 lateness went from 272 ms to 138 ms frozen.
    gc.freeze, as long-lived Python servers use it; start-up's garbage is collected first."""
    gc.collect()
    gc.freeze()


async def start_worker_pools(config: Config, ctx: Context) -> None:
    if not config.workers:
        return
    from mega.workers.pool import WorkerPool

    for worker_class in config.workers:
        pool = WorkerPool(worker_class, root=config.root)
        if config.metrics.enabled:
            from mega.runtime.metrics import observe_pool

            observe_pool(pool)
        await pool.start()
        ctx.workers[pool.name] = pool


async def run_hooks(config: Config, host: str, runtime: Any, ctx: Context) -> None:
    """The config's `hooks[host]`, each called as hook(runtime, ctx) (async or not)."""
    for hook in config.hooks.get(host, []):
        result = hook(runtime, ctx)
        if inspect.isawaitable(result):
            await result


async def stop_worker_pools(ctx: Context) -> None:
    for pool in ctx.workers.values():
        await pool.stop()
