"""What a job class declares, validated: the settings of a Job (`JobBase`, which `mega.Job`
extends with `enqueue`), its `JobSpec`, and the message one run travels as. `JobQueue` moves
jobs; this module only describes them, validates them and encodes their payloads.

The class attributes are documented on `mega.Job` (mega/jobs/job.py); a Listener shares the
consume settings of `Consumed`, and a plain `def run` of either runs on a thread (`threaded`).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mega import clock
from mega.declaration import (
    NonEmptyStr,
    declared_alias,
    matching,
    rule,
    validate_subclass,
)
from mega.drivers.base import PRIORITIES, Lane, Message, Priority
from mega.errors import JobError
from mega.lanes.declaration import (
    DELAY_TOKEN,
    DLQ_SUFFIX,
    FAIR_TOKEN,
    SUBJECT_RE,
    SUBJECT_RULE,
    Consumed,
    ConsumedDeclaration,
    ConsumedSpec,
    json_body,
)
from mega.validation import MAX_ID_LENGTH, MAX_PAYLOAD_BYTES, is_number, is_token, shortened

if TYPE_CHECKING:
    from mega.jobs.progress import JobContext

# A job's status record is kept this long after its last change; its result not at all.
DEFAULT_KEEP_STATUS_S = 24 * 3600
DEFAULT_KEEP_RESULT_S = 0


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
        """Do the work. Raise to fail this attempt (it is retried, then dead-lettered). A plain
        `def run(self, payload, ctx)` runs on a thread instead (see `threaded`).

        Args:
            payload: the decoded JSON, or an instance of `schema` when the job declares one.
            ctx: the host's Context plus this run: `ctx.job_id`, `ctx.attempt`, and
                `await ctx.progress(fraction, note)` to report how far it got
                (mega/jobs/progress.py).
        """
        raise NotImplementedError


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
        job_cls=job_cls,
        name=job.name,
        subject=job.subject,
        bus=job.bus,
        dlq_max_bytes=job.dlq_max_bytes,
        max_payload_bytes=job.max_payload_bytes,
        schema=job.payload_schema,
        keep_status_s=job.keep_status_s,
        keep_result_s=job.keep_result_s,
        key_concurrency=job.key_concurrency,
        fair=job.fair,
        prioritized=job.prioritized,
        durable=job.durable,
        **job.consumed(),
    )


# -- the message ---------------------------------------------------------------------------


def encode_job(
    spec: JobSpec,
    payload: Any,
    *,
    job_id: str | None = None,
    due_ms: int | None = None,
    now_ms: int | None = None,
    key: str | None = None,
    priority: str | None = None,
) -> Message:
    """Build the message of one job (pure but for the clock and a random id).

    `job_id` (caller-given) is the dedup key; default a random uuid. `due_ms` (epoch ms) in
    the future holds the job until then; `now_ms`, the enqueue time, when the caller read the
    clock for both (a delay then adds to it exactly). `key`: the job's key for its limits per
    key (mega/lanes/flow.py). `priority`: its band, on a `prioritized` job only (None: normal).
    The payload is checked against the job's `schema` first, when it has one. Raises JobError
    `job.invalid_payload` / `job.invalid_id` / `job.invalid_key` / `job.invalid_priority`
    before anything is stored."""
    if spec.schema is not None:
        payload = fit_schema(spec, payload).model_dump(mode="json")
    body = json_body(spec.name, payload, "job", spec.max_payload_bytes)
    if now_ms is None:
        now_ms = clock.now_ms()
    dedup = job_id is not None
    if job_id is None:
        job_id = uuid.uuid4().hex
    else:
        _check_token(spec, job_id, "id")
    if key is not None:
        _check_token(spec, key, "key")
    run_at_ms = due_ms if due_ms is not None and due_ms > now_ms else None
    return Message(
        job_id,
        spec.subject,
        body,
        now_ms,
        run_at_ms,
        dedup=dedup,
        flow_key=key,
        priority=_band(spec, priority),
    )


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
    spec: JobSpec,
    delay: float | timedelta | None,
    run_at: datetime | None,
    now_ms: int | None = None,
) -> int | None:
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
        now_ms = clock.now_ms()
    return now_ms + round(seconds * 1000)


def _check_token(spec: JobSpec, value: object, what: Literal["id", "key"]) -> None:
    if not is_token(value):
        raise JobError(
            f"{spec.name}: {what} must be 1-{MAX_ID_LENGTH} printable characters without "
            f"spaces, got {shortened(value)}",
            code=f"job.invalid_{what}",
        )


@functools.lru_cache(maxsize=1024)
def job_lane(spec: JobSpec) -> Lane:
    """What a driver needs to know of a job's queue (made once per spec: enqueue's hot path)."""
    return Lane(
        kind="job",
        name=spec.name,
        subject=spec.subject,
        concurrency=spec.concurrency,
        ack_wait_s=spec.ack_wait_s,
        dlq_max_age_s=spec.dlq_max_age_s,
        dlq_max_bytes=spec.dlq_max_bytes,
        replicas=spec.replicas,
        keep_status_s=spec.keep_status_s,
        keep_result_s=spec.keep_result_s,
        fair=spec.fair,
        prioritized=spec.prioritized,
        durable=spec.durable,
    )
