"""What a job class declares, validated: the settings of a Job (`JobBase`, which `mega.Job`
extends with `enqueue`), its `JobSpec`, and the message one run travels as. `JobQueue` moves
jobs; this module only describes them, validates them and encodes their payloads.

The class attributes are documented on `mega.Job` (mega/jobs/job.py); a Listener shares the
consume settings of `Consumed`, and a plain `def run` of either runs on a thread (`threaded`).
"""

from __future__ import annotations

import inspect
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mega.declaration import (
    Declaration,
    NonEmptyStr,
    NonNegativeInt,
    PositiveInt,
    declared_alias,
    matching,
    rule,
    validate_subclass,
)
from mega.drivers.base import PRIORITIES, Message, Priority
from mega.errors import JobError
from mega.jobs.backoff import BackoffPolicy
from mega.jobs.ratelimit import RateLimit
from mega.validation import MAX_ID_LENGTH, MAX_PAYLOAD_BYTES, is_number, is_token, shortened

if TYPE_CHECKING:
    from mega.jobs.progress import JobContext

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

# A job's status record is kept this long after its last change; its result not at all.
DEFAULT_KEEP_STATUS_S = 24 * 3600
DEFAULT_KEEP_RESULT_S = 0


class Consumed:
    """What the consume loop reads of a Job or a Listener class, with its defaults: how many
    run at once (`concurrency`), how often and how patiently a failure is tried again
    (`retries`, `backoff`), how long a delivery may go unsettled (`ack_wait_s`), how long its
    dead letters are kept (`dlq_max_age_s`), copies of its data in a cluster (`replicas`), how
    long one run may take (`timeout_s`, None: no limit), which errors skip the retries
    (`permanent`, besides `mega.Permanent`), how many may start in a period across the
    whole group (`rate_limit`, None: no limit; see mega/jobs/ratelimit.py) and the cache
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


class JobBase(Consumed):
    """What every job declares (the attributes are documented on `mega.Job`, which adds
    `enqueue`). The worker makes one instance per consume loop: keep no per-run state on
    `self`."""

    subject: ClassVar[str]
    bus: ClassVar[str]
    name: ClassVar[str]
    dlq_max_bytes: ClassVar[int | None] = None
    max_payload_bytes: ClassVar[int] = MAX_PAYLOAD_BYTES
    schema: ClassVar[type[BaseModel] | None] = None
    keep_status_s: ClassVar[float] = DEFAULT_KEEP_STATUS_S
    keep_result_s: ClassVar[float] = DEFAULT_KEEP_RESULT_S
    key_concurrency: ClassVar[int | None] = None
    fair: ClassVar[bool] = False
    prioritized: ClassVar[bool] = False
    durable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    # Declared plain (returning Any) so that both `async def run` and a plain `def run` type
    # check as overrides.
    def run(self, payload: Any, ctx: JobContext) -> Any:
        """Do the work. Raise to fail this attempt (it is retried, then dead-lettered).

        `payload` is the decoded JSON, or an instance of `schema` when the job declares one.
        `ctx` is the host's Context plus this run: `ctx.job_id`, `ctx.attempt`, and
        `await ctx.progress(fraction, note)` to report how far it got (mega/jobs/progress.py).
        A plain `def run(self, payload, ctx)` runs on a thread instead (see `threaded`)."""
        raise NotImplementedError


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


@dataclass(frozen=True, kw_only=True)
class JobSpec(ConsumedSpec):
    """A validated Job class with everything the queue derives from it."""

    job_cls: type[JobBase]
    name: str
    subject: str
    bus: str
    dlq_max_bytes: int | None
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    schema: type[BaseModel] | None = None
    keep_status_s: float = DEFAULT_KEEP_STATUS_S
    keep_result_s: float = DEFAULT_KEEP_RESULT_S
    fair: bool = False
    prioritized: bool = False
    durable: bool = False


class JobId(str):
    """What `enqueue` answers: the job's id, a plain `str`, that also says whether this call
    stored the job. `duplicate` is True when the bus already had a job with this id (within
    its dedup window, or still being stored by an earlier call), so nothing new was stored and
    the job runs once."""

    __slots__ = ("duplicate",)
    duplicate: bool

    def __new__(cls, job_id: str, *, duplicate: bool = False) -> Self:
        answer = super().__new__(cls, job_id)
        answer.duplicate = duplicate
        return answer


# -- validation --------------------------------------------------------------------------------

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


class JobDeclaration(ConsumedDeclaration):
    """The class attributes of a Job."""

    base_run: ClassVar[object] = JobBase.run
    run_signature: ClassVar[str] = "(self, payload, ctx)"

    subject: Annotated[StrictStr, matching(SUBJECT_RE), rule(SUBJECT_RULE)]
    bus: str
    dlq_max_bytes: Annotated[
        Annotated[StrictInt, Field(ge=1)] | None, rule("must be None or a positive int")
    ]
    name: NonEmptyStr
    max_payload_bytes: Annotated[
        StrictInt, Field(ge=1), rule("must be a positive int: the payload's bytes as JSON")
    ]
    keep_status_s: Annotated[
        StrictFloat, Field(ge=0, allow_inf_nan=False), rule("must be >= 0 s (0: no status)")
    ]
    keep_result_s: Annotated[
        StrictFloat, Field(ge=0, allow_inf_nan=False), rule("must be >= 0 s (0: not kept)")
    ]
    key_concurrency: Annotated[
        Annotated[StrictInt, Field(ge=1)] | None,
        rule("must be None (no cap) or an int >= 1: the runs of one key at once"),
    ]
    fair: Annotated[StrictBool, rule("must be True (round-robin across keys) or False")]
    prioritized: Annotated[
        StrictBool, rule("must be True (enqueue takes a priority: high, normal, low) or False")
    ]
    durable: Annotated[
        StrictBool, rule("must be True (enqueue waits for a replica's copy) or False")
    ]
    # `schema` would shadow a BaseModel attribute: the field takes the attribute's name as alias.
    payload_schema: Annotated[
        type[BaseModel] | None, rule("must be a pydantic model class (a BaseModel) or None")
    ] = Field(alias="schema")

    @field_validator("subject")
    @classmethod
    def _not_reserved(cls, subject: str) -> str:
        if subject.endswith(DLQ_SUFFIX):
            raise ValueError(f"must not end in {DLQ_SUFFIX!r} (reserved for the dead letters)")
        if DELAY_TOKEN in subject.split("."):
            raise ValueError(f"the token {DELAY_TOKEN!r} is reserved for delayed jobs")
        if FAIR_TOKEN in subject.split("."):
            raise ValueError(f"the token {FAIR_TOKEN!r} is reserved for fair jobs")
        return subject

    @field_validator("prioritized")
    @classmethod
    def _not_fair_too(cls, prioritized: bool, info: ValidationInfo) -> bool:
        if prioritized and info.data.get("fair"):
            raise ValueError(
                "a job takes turns by key (fair) or by priority (prioritized), not both: "
                "drop one, or make two jobs"
            )
        return prioritized

    @field_validator("bus", mode="before")
    @classmethod
    def _declared_bus(cls, bus: object, info: ValidationInfo) -> str:
        return declared_alias(bus, "bus", info)


def validate_job(job_cls: type[JobBase], bus_aliases: Collection[str]) -> JobSpec:
    """Check every attribute of a Job class at once; RegistrationError lists each bad field."""
    context = {"bus_aliases": bus_aliases}
    job = validate_subclass(JobDeclaration, job_cls, JobBase, "job", context)
    return JobSpec(
        job_cls=job_cls, name=job.name, subject=job.subject, bus=job.bus,
        dlq_max_bytes=job.dlq_max_bytes, max_payload_bytes=job.max_payload_bytes,
        schema=job.payload_schema,
        keep_status_s=job.keep_status_s, keep_result_s=job.keep_result_s,
        key_concurrency=job.key_concurrency, fair=job.fair, prioritized=job.prioritized,
        durable=job.durable,
        **job.consumed(),
    )  # fmt: skip


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


# -- the message ---------------------------------------------------------------------------


def json_body(
    name: str, payload: Any, kind: Literal["job", "event"], max_bytes: int = MAX_PAYLOAD_BYTES,
    error: type[JobError] = JobError,
) -> bytes:  # fmt: skip
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
            f"{name}: payload is nested too deep to encode (keep it a few hundred levels at "
            "most)", code=f"{kind}.invalid_payload",
        ) from None  # fmt: skip
    if len(body) > max_bytes:
        cap = f"its max_payload_bytes ({max_bytes:,})"
        raise error(too_large(name, len(body), cap), code=f"{kind}.payload_too_large")
    return body


def check_engine_cap(
    name: str, bodies: Iterable[bytes], bus: object, kind: Literal["job", "event"],
    error: type[JobError] = JobError,
) -> None:  # fmt: skip
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


def encode_job(
    spec: JobSpec, payload: Any, *, job_id: str | None = None, due_ms: int | None = None,
    now_ms: int | None = None, key: str | None = None, priority: str | None = None,
) -> Message:  # fmt: skip
    """Build the message of one job (pure but for the clock and a random id).

    `job_id` (caller-given) is the dedup key; default a random uuid. `due_ms` (epoch ms) in
    the future holds the job until then; `now_ms`, the enqueue time, when the caller read the
    clock for both (a delay then adds to it exactly). `key`: the job's key for its limits per
    key (mega/jobs/flow.py). `priority`: its band, on a `prioritized` job only (None: normal).
    The payload is checked against the job's `schema` first, when it has one. Raises JobError
    `job.invalid_payload` / `job.invalid_id` / `job.invalid_key` / `job.invalid_priority`
    before anything is stored."""
    if spec.schema is not None:
        payload = fit_schema(spec, payload).model_dump(mode="json")
    body = json_body(spec.name, payload, "job", spec.max_payload_bytes)
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    dedup = job_id is not None
    if job_id is None:
        job_id = uuid.uuid4().hex
    else:
        _check_token(spec, job_id, "id")
    if key is not None:
        _check_token(spec, key, "key")
    run_at_ms = due_ms if due_ms is not None and due_ms > now_ms else None
    return Message(
        job_id, spec.subject, body, now_ms, run_at_ms, dedup=dedup, flow_key=key,
        priority=_band(spec, priority),
    )  # fmt: skip


def _band(spec: JobSpec, priority: str | None) -> Priority:
    """The band of a job enqueued with `priority`; JobError `job.invalid_priority` for one
    that is not a band, or given to a job that is not `prioritized`."""
    if priority is None:
        return "normal"
    if priority not in PRIORITIES:
        raise JobError(
            f"{spec.name}: priority must be one of {', '.join(PRIORITIES)}, got {priority!r}",
            code="job.invalid_priority",
        )
    if not spec.prioritized:
        raise JobError(
            f"{spec.name} takes no priority: set prioritized = True on it (its jobs then take "
            "turns by band), or enqueue it without one",
            code="job.invalid_priority",
        )
    return priority


def fit_schema(spec: JobSpec, payload: Any) -> BaseModel:
    """The payload as an instance of the job's `schema` (validated unless it is one already);
    JobError `job.invalid_payload` naming each field that does not fit."""
    assert spec.schema is not None
    if isinstance(payload, spec.schema):
        return payload
    try:
        return spec.schema.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'payload'}: {error['msg']}"
            for error in exc.errors(include_url=False)
        )
        raise JobError(
            f"{spec.name}: payload does not fit {spec.schema.__name__}: {problems}",
            code="job.invalid_payload",
        ) from None


def due_ms_of(
    spec: JobSpec, delay: float | timedelta | None, run_at: datetime | None,
    now_ms: int | None = None,
) -> int | None:  # fmt: skip
    """Epoch ms a job is due at from `delay` (s or timedelta, >= 0, after `now_ms`, default
    now) or `run_at` (aware), or None when neither is given. Raises JobError
    `job.invalid_delay`."""
    if delay is not None and run_at is not None:
        raise JobError(f"{spec.name}: give delay or run_at, not both", code="job.invalid_delay")
    if run_at is not None:
        if run_at.tzinfo is None:
            raise JobError(f"{spec.name}: run_at must be timezone-aware", code="job.invalid_delay")
        return int(run_at.timestamp() * 1000)
    if delay is None:
        return None
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if not is_number(seconds) or seconds < 0:
        raise JobError(
            f"{spec.name}: delay must be >= 0 seconds, got {delay!r}", code="job.invalid_delay"
        )
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    return now_ms + round(seconds * 1000)


def _check_token(spec: JobSpec, value: object, what: Literal["id", "key"]) -> None:
    if not is_token(value):
        raise JobError(
            f"{spec.name}: {what} must be 1-{MAX_ID_LENGTH} printable characters without "
            f"spaces, got {shortened(value)}",
            code=f"job.invalid_{what}",
        )
