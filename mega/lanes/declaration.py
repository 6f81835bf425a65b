"""What the consume loop reads of a Job's or a Listener's class (`Consumed`), validated the same
for both (`ConsumedDeclaration`, `ConsumedSpec`), the subjects they may take, a plain `def run`
on a thread (`threaded`), and a payload as the JSON body a lane carries (`json_body`)."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PlainValidator, StrictFloat, StrictInt, StrictStr, field_validator

from mega.declaration import Declaration, NonNegativeInt, PositiveInt, rule
from mega.errors import JobError
from mega.lanes.backoff import BackoffPolicy
from mega.lanes.ratelimit import RateLimit
from mega.validation import MAX_PAYLOAD_BYTES

# Letters, digits, `_` and `-` in non-empty tokens joined by dots: no wildcards, no spaces.
SUBJECT_RE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
# `<subject>.dlq` is the dead-letter subject, so no job may own it.
DLQ_SUFFIX = ".dlq"
# Delayed jobs wait as broker-side schedules on `<subject>._delay.<token>` (see queue.py), so
# this token is reserved: a job on `a._delay.b` would overlap the stream of job `a`.
DELAY_TOKEN = "_delay"
FAIR_TOKEN = "_fair"  # a fair job's keys' subjects on NATS: `<subject>._fair.<key>`
# Copies of a job's data in a cluster (a NATS stream's replicas): JetStream allows at most five.
MAX_REPLICAS = 5

DEFAULT_CONCURRENCY = 1
DEFAULT_RETRIES = 3
DEFAULT_BACKOFF: dict[str, Any] = {"type": "exponential", "initial": 1000, "max": 30_000}
# Redelivery timeout of an unacked message; a running job renews it every third of it.
DEFAULT_ACK_WAIT_S = 30.0
# Dead letters expire after a week by default so a failing job cannot fill the disk.
DEFAULT_DLQ_MAX_AGE_S = 7 * 24 * 3600


class Consumed:
    """What the consume loop reads of a Job or a Listener class, with its defaults: how many
    run at once (`concurrency`), how often and how patiently a failure is tried again
    (`retries`, `backoff`), how long a delivery may go unsettled (`ack_wait_s`), how long its
    dead letters are kept (`dlq_max_age_s`), copies of its data in a cluster (`replicas`), how
    long one run may take (`timeout_s`, None: no limit), which errors skip the retries
    (`permanent`, besides `mega.Permanent`), how many may start in a period across the
    whole group (`rate_limit`, None: no limit; see mega/lanes/ratelimit.py) and the cache
    that counts them (`flow_cache`, None: the config's only cache)."""

    concurrency: ClassVar[int] = DEFAULT_CONCURRENCY
    retries: ClassVar[int] = DEFAULT_RETRIES
    backoff: ClassVar[dict[str, Any]] = DEFAULT_BACKOFF
    ack_wait_s: ClassVar[float] = DEFAULT_ACK_WAIT_S
    dlq_max_age_s: ClassVar[float] = DEFAULT_DLQ_MAX_AGE_S
    replicas: ClassVar[int] = 1
    timeout_s: ClassVar[float | None] = None
    permanent: ClassVar[tuple[type[Exception], ...]] = ()
    rate_limit: ClassVar[dict[str, Any] | None] = None
    flow_cache: ClassVar[str | None] = None


@dataclass(frozen=True, kw_only=True)
class ConsumedSpec:
    """The validated settings of a Consumed class (a JobSpec's, a ListenerSpec's)."""

    concurrency: int
    retries: int
    backoff: BackoffPolicy
    ack_wait_s: float
    dlq_max_age_s: float
    replicas: int = 1
    timeout_s: float | None = None
    permanent: tuple[type[Exception], ...] = ()
    rate_limit: RateLimit | None = None
    flow_cache: str | None = None
    key_concurrency: int | None = None  # a Job's alone: events carry no key

    @property
    def max_attempts(self) -> int:
        return self.retries + 1


SUBJECT_RULE = "letters, digits, '.', '_' and '-' only"

# What the consume loop reads of a Job or a Listener class, checked the same for both.
Replicas = Annotated[
    StrictInt,
    Field(ge=1, le=MAX_REPLICAS),
    rule(f"must be an int from 1 to {MAX_REPLICAS} (NATS's limit)"),
]
Backoff = Annotated[BackoffPolicy, PlainValidator(BackoffPolicy.parse)]
AckWait = Annotated[
    StrictFloat, Field(gt=0, allow_inf_nan=False), rule("must be a positive number of seconds")
]
DlqMaxAge = Annotated[
    StrictFloat, Field(ge=0, allow_inf_nan=False), rule("must be >= 0 s (0 = keep)")
]
TimeoutS = Annotated[
    Annotated[StrictFloat, Field(gt=0, allow_inf_nan=False)] | None,
    rule("must be None (no limit) or a positive number of seconds"),
]
RateLimitField = Annotated[
    RateLimit | None,
    rule(
        'must be None (no limit) or {"limit": starts >= 1, "period_s": seconds > 0} with '
        'optionally "per": "key" (a limit for each key)'
    ),
]


class ConsumedDeclaration(Declaration):
    """The class attributes of a Consumed class (a Job, a Listener), checked the same for both;
    their problems are reported after those of the fields a subclass declares first."""

    concurrency: PositiveInt
    retries: NonNegativeInt
    replicas: Replicas
    backoff: Backoff
    ack_wait_s: AckWait
    dlq_max_age_s: DlqMaxAge
    timeout_s: TimeoutS
    permanent: Any
    rate_limit: RateLimitField
    # Its cache is looked up when a worker starts (and by `mega check`).
    flow_cache: Annotated[
        Annotated[StrictStr, Field(min_length=1)] | None,
        rule("must be None (the config's only cache) or the alias of a cache"),
    ]

    run: Any
    # What a subclass says of its class's `run`: the base's own (never overridden), and the
    # signature an override has.
    base_run: ClassVar[object] = None
    run_signature: ClassVar[str] = ""

    @field_validator("run")
    @classmethod
    def _overridden_run(cls, run: object) -> object:
        if run is cls.base_run or not inspect.isfunction(run) or inspect.isgeneratorfunction(run):
            raise ValueError(
                f"override it with `async def run{cls.run_signature}` (or a plain `def run`, "
                "which runs on a thread)"
            )
        return run

    @field_validator("permanent", mode="before")
    @classmethod
    def _exception_classes(cls, permanent: object) -> tuple[type[Exception], ...]:
        classes = permanent if isinstance(permanent, (tuple, list)) else (permanent,)
        if permanent is None or not all(
            isinstance(c, type) and issubclass(c, Exception) for c in classes
        ):
            raise ValueError("must be a tuple of exception classes, such as (KeyError,)")
        return tuple(classes)

    def consumed(self) -> dict[str, Any]:
        """The settings, as ConsumedSpec's keyword arguments."""
        settings = set(ConsumedDeclaration.model_fields) - {"run"}
        return {name: getattr(self, name) for name in settings}


def threaded(run: Callable[..., Any], concurrency: int) -> Callable[..., Awaitable[Any]]:
    """`run` (a Job's or a Listener's) as a coroutine function: itself when it is async, else
    a call on a worker thread, at most `concurrency` at once, so that the event loop, and the
    lease heartbeats it sends while the run lasts, keep going. Call it in the running loop."""
    if inspect.iscoroutinefunction(run):
        return run
    import anyio.to_thread  # here: a host whose runs are all async never loads anyio

    limiter = anyio.CapacityLimiter(concurrency)

    async def on_a_thread(*args: Any) -> Any:
        # A thread cannot be interrupted: a cancelled run (a stop's drain time up) lets it go.
        return await anyio.to_thread.run_sync(run, *args, limiter=limiter, abandon_on_cancel=True)

    return on_a_thread


# -- the body ------------------------------------------------------------------------------


def json_body(
    name: str,
    payload: Any,
    kind: Literal["job", "event"],
    max_bytes: int = MAX_PAYLOAD_BYTES,
    error: type[JobError] = JobError,
) -> bytes:
    """A payload as compact JSON of at most `max_bytes`; `error` naming `name` otherwise, with
    the code `<kind>.invalid_payload` (not JSON, or nested too deep to encode) or
    `<kind>.payload_too_large`."""
    try:
        body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise error(
            f"{name}: payload must be JSON-serialisable ({exc})", code=f"{kind}.invalid_payload"
        ) from None
    except RecursionError:
        raise error(
            f"{name}: payload is nested too deep to encode (keep it a few hundred levels at most)",
            code=f"{kind}.invalid_payload",
        ) from None
    if len(body) > max_bytes:
        cap = f"its max_payload_bytes ({max_bytes:,})"
        raise error(too_large(name, len(body), cap), code=f"{kind}.payload_too_large")
    return body


def check_engine_cap(
    name: str,
    bodies: Iterable[bytes],
    bus: object,
    kind: Literal["job", "event"],
    error: type[JobError] = JobError,
) -> None:
    """Refuse, before anything is sent, a body over what the bus's engine takes at most (its
    driver's `max_body_bytes`, where it has one: a NATS server's max_payload): `error` with
    `<kind>.payload_too_large` naming both. A refused publish would otherwise read as an
    outage, and the records sent beside it would say `queued`."""
    limit = getattr(bus, "max_body_bytes", None)
    if limit is None:
        return
    for body in bodies:
        if len(body) > limit:
            cap = f"what its bus's server takes (max_payload less its headers: {limit:,})"
            raise error(too_large(name, len(body), cap), code=f"{kind}.payload_too_large")


def too_large(name: str, size: int, cap: str) -> str:
    """The sentence of a payload over `cap` (the cap as said: what it is and its bytes)."""
    return (
        f"{name}: payload is {size:,} bytes as JSON, over {cap}: store big data elsewhere (a "
        "table, object storage) and pass its key"
    )
