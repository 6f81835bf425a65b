"""What a route needs from the framework, said in its signature with `Annotated` dependencies.

    from mega.web import CtxDep, UserDep, pool_dep, provided, queue_dep

    QueueDep = Annotated[JobQueue, Depends(queue_dep("jobs"))]      # a bus alias of the config
    HashPool = Annotated[WorkerPool, Depends(pool_dep("hash"))]     # a Worker's `name`
    ClockDep = Annotated[Clock, Depends(provided(Clock))]           # the app's own object

    @router.post("/api/things")
    async def add(body: Thing, user: UserDep, ctx: CtxDep, queue: QueueDep) -> Response:
        await queue.enqueue(ThingJob, body.model_dump())
        ...

Each dependency is a plain function of the request, so a helper can call it too. The app keeps
one JobQueue per bus alias, and one object per class given to `provide` (or made on first use
by `provided(cls, default=...)`), for its whole life: a signal observer attached at start
(metrics, a log) hears every route's use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

from fastapi import Depends, FastAPI, Request

from mega.context import Context
from mega.errors import ConfigError
from mega.jobs.queue import JobQueue

if TYPE_CHECKING:
    from mega.workers.pool import WorkerPool

T = TypeVar("T")


def context(request: Request) -> Context:
    """The app's Context: its caches, locks, buses, database and CPU pools.

    Args:
        request: the request being served (FastAPI passes it to a dependency).
    """
    ctx: Context = request.app.state.ctx
    return ctx


CtxDep = Annotated[Context, Depends(context)]


def job_queue(app: FastAPI, bus: str) -> JobQueue:
    """The app's one JobQueue on bus alias `bus` (made on first use); `queue_dep(bus)` gives
    the same one to routes, so observe it here at start (`observe_jobs`).

    Args:
        app: the app `create_web_app` made.
        bus: a bus alias of the config, a key of `services.buses`.
    """
    queues: dict[str, JobQueue] = _kept(app, "mega_job_queues")
    if bus not in queues:
        queues[bus] = JobQueue(app.state.ctx, bus)
    return queues[bus]


def queue_dep(bus: str) -> Callable[[Request], JobQueue]:
    """A dependency giving the app's JobQueue on bus alias `bus`.

    Args:
        bus: a bus alias of the config, a key of `services.buses`.
    """

    def queue(request: Request) -> JobQueue:
        return job_queue(request.app, bus)

    return queue


def pool_dep(name: str) -> Callable[[Request], WorkerPool]:
    """A dependency giving the running CPU pool of the Worker named `name`. The pools run in
    the web process when `mega start` (or `mega.runtime.asgi_app`) started them; a ConfigError names
    the ones that did.

    Args:
        name: the Worker's `name`, its key in `ctx.workers`.
    """

    def pool(request: Request) -> WorkerPool:
        pools = context(request).workers
        if name not in pools:
            started = ", ".join(sorted(pools)) or "none"
            raise ConfigError(f"workers: no pool {name!r} runs here (started: {started})")
        return cast("WorkerPool", pools[name])

    return pool


def provide(app: FastAPI, value: object) -> None:
    """Keep `value` as the app's one object of its class, for `provided(type(value))`.

    Args:
        app: the app `create_web_app` made.
        value: the object; it replaces one of the same class provided before.
    """
    _kept(app, "mega_provided")[type(value)] = value


def provided(cls: type[T], *, default: Callable[[], T] | None = None) -> Callable[[Request], T]:
    """A dependency giving the object of class `cls` given to `provide(app, ...)`.

    Args:
        cls: the object's class itself (a base class does not find it).
        default: called once to make the object when none was provided, which is then kept;
            None: a ConfigError naming the class instead.
    """

    def lookup(request: Request) -> T:
        kept: dict[type, Any] = _kept(request.app, "mega_provided")
        if cls not in kept:
            if default is None:
                raise ConfigError(f"no {cls.__name__} provided: call provide(app, ...) at start")
            kept[cls] = default()
        return cast(T, kept[cls])

    return lookup


def _kept(app: FastAPI, key: str) -> dict[Any, Any]:
    """A dict on the app's state, made on first use."""
    if not hasattr(app.state, key):
        setattr(app.state, key, {})
    kept: dict[Any, Any] = getattr(app.state, key)
    return kept
