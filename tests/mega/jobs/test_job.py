"""Job validation and the job's message (pure, no broker)."""

from __future__ import annotations

import json
import time
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mega.errors import JobError, RegistrationError
from mega.jobs.job import Job
from mega.jobs.queue import queue_of
from mega.jobs.spec import JobSpec, due_ms_of, encode_job, job_lane, validate_job

BUSES = {"jobs"}


class EmailJob(Job):
    subject = "demo.email"
    bus = "jobs"
    concurrency = 2
    retries = 2
    backoff = {"type": "exponential", "initial": 500, "max": 2000}

    async def run(self, payload: Any, ctx: Any) -> None:
        return None


def variant(**attrs: Any) -> type[Job]:
    """EmailJob with some class attributes replaced."""
    return type("Variant", (EmailJob,), attrs)


def test_valid_job_spec() -> None:
    spec = validate_job(EmailJob, BUSES)
    assert spec.name == "EmailJob"
    assert (spec.subject, spec.bus, spec.concurrency, spec.retries) == ("demo.email", "jobs", 2, 2)
    assert spec.max_attempts == 3
    assert (spec.backoff.initial_ms, spec.backoff.max_ms) == (500, 2000)
    assert spec.ack_wait_s == 30.0
    assert spec.dlq_max_age_s == 7 * 24 * 3600
    assert spec.dlq_max_bytes is None


def test_defaults() -> None:
    class Minimal(Job):
        subject = "a"
        bus = "jobs"

        async def run(self, payload: Any, ctx: Any) -> None:
            return None

    spec = validate_job(Minimal, BUSES)
    assert (spec.concurrency, spec.retries) == (1, 3)
    assert (spec.backoff.initial_ms, spec.backoff.max_ms) == (1000, 30_000)


@pytest.mark.parametrize(
    ("attrs", "field"),
    [
        ({"subject": "demo.*"}, "subject"),
        ({"subject": "demo.>"}, "subject"),
        ({"subject": "demo email"}, "subject"),
        ({"subject": ""}, "subject"),
        ({"subject": "demo..email"}, "subject"),
        ({"subject": ".demo"}, "subject"),
        ({"subject": "demo."}, "subject"),
        ({"subject": "demo.email.dlq"}, "subject"),
        ({"subject": "demo._delay.x"}, "subject"),
        ({"subject": 42}, "subject"),
        ({"bus": "nope"}, "bus"),
        ({"bus": None}, "bus"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -1}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"retries": -1}, "retries"),
        ({"retries": "3"}, "retries"),
        ({"backoff": {"type": "fixed", "initial": 1, "max": 1}}, "backoff"),
        ({"backoff": {"type": "exponential", "initial": 100, "max": 10}}, "backoff"),
        ({"ack_wait_s": 0}, "ack_wait_s"),
        ({"ack_wait_s": "30"}, "ack_wait_s"),
        ({"dlq_max_age_s": -1}, "dlq_max_age_s"),
        ({"dlq_max_bytes": 0}, "dlq_max_bytes"),
        ({"dlq_max_bytes": 1.5}, "dlq_max_bytes"),
        ({"replicas": 0}, "replicas"),
        ({"replicas": 6}, "replicas"),
        ({"fair": "yes"}, "fair"),
        ({"prioritized": 1}, "prioritized"),
        ({"fair": True, "prioritized": True}, "prioritized"),
        ({"durable": 1}, "durable"),
    ],
)
def test_invalid_attributes_name_the_field(attrs: dict[str, Any], field: str) -> None:
    with pytest.raises(RegistrationError) as caught:
        validate_job(variant(**attrs), BUSES)
    assert str(caught.value).startswith("job 'Variant' is invalid: ")
    assert f" {field}: " in str(caught.value)


def test_a_job_takes_turns_by_key_or_by_priority_not_both() -> None:
    with pytest.raises(RegistrationError) as caught:
        validate_job(variant(fair=True, prioritized=True), BUSES)
    assert "prioritized: a job takes turns by key (fair) or by priority (prioritized)" in str(
        caught.value
    )
    assert "not both: drop one, or make two jobs" in str(caught.value)
    assert validate_job(variant(prioritized=True), BUSES).prioritized is True


def test_durable_is_carried_to_the_drivers_lane() -> None:
    assert job_lane(validate_job(variant(), BUSES)).durable is False
    assert job_lane(validate_job(variant(durable=True, fair=True), BUSES)).durable is True


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(RegistrationError) as caught:
        validate_job(variant(subject="a b", bus="nope", retries=True, ack_wait_s=0), BUSES)
    problems = str(caught.value).split(": ", 1)[1].split("; ")
    assert [p.split(":")[0] for p in problems] == ["subject", "bus", "retries", "ack_wait_s"]
    assert "retries: must be an int >= 0, got True" in problems


@pytest.mark.parametrize("replicas", [0, 6, True, 2.0])
def test_replicas_message_says_the_range(replicas: object) -> None:
    with pytest.raises(RegistrationError) as caught:
        validate_job(variant(replicas=replicas), BUSES)
    assert str(caught.value).endswith(
        f"replicas: must be an int from 1 to 5 (NATS's limit), got {replicas!r}"
    )


@pytest.mark.parametrize("subject", ["dlq", "dlq.stats", "demo.dlqx", "a_delay.b", "A-1.b_2"])
def test_unusual_but_valid_subjects(subject: str) -> None:
    assert validate_job(variant(subject=subject), BUSES).subject == subject


def test_zero_dlq_age_means_forever_and_byte_cap_is_kept() -> None:
    spec = validate_job(variant(dlq_max_age_s=0, dlq_max_bytes=1_000_000), BUSES)
    assert (spec.dlq_max_age_s, spec.dlq_max_bytes) == (0, 1_000_000)


def test_run_must_be_overridden_by_a_function() -> None:
    class NoRun(Job):
        subject = "a"
        bus = "jobs"

    class GeneratorRun(Job):
        subject = "a"
        bus = "jobs"

        def run(self, payload: Any, ctx: Any) -> Any:
            yield payload

    class SyncRun(Job):
        subject = "a"
        bus = "jobs"

        def run(self, payload: Any, ctx: Any) -> None:
            return None

    for job_cls in (NoRun, GeneratorRun):
        with pytest.raises(RegistrationError, match=r"invalid: run: override it with `async def"):
            validate_job(job_cls, BUSES)
    assert validate_job(SyncRun, BUSES).job_cls is SyncRun  # a plain def runs on a thread


def test_not_a_job_class() -> None:
    with pytest.raises(RegistrationError, match=r"subclass of mega\.Job"):
        validate_job(dict, BUSES)  # type: ignore[arg-type]


def test_missing_subject() -> None:
    class Unnamed(Job):
        bus = "jobs"

        async def run(self, payload: Any, ctx: Any) -> None:
            return None

    with pytest.raises(RegistrationError, match=r"job .Unnamed. is invalid: subject: "):
        validate_job(Unnamed, BUSES)


# -- the message ----------------------------------------------------------------------------------


@pytest.fixture
def spec() -> JobSpec:
    return validate_job(EmailJob, BUSES)


def test_message_of_a_plain_job(spec: JobSpec) -> None:
    before = int(time.time() * 1000)
    message = encode_job(spec, {"to": "a@b.c", "n": [1, 2]})
    assert message.subject == "demo.email"
    assert json.loads(message.body) == {"to": "a@b.c", "n": [1, 2]}
    assert len(message.id) == 32 and not message.dedup  # only a caller id is a dedup key
    assert before <= message.enqueued_at_ms <= int(time.time() * 1000)
    assert message.run_at_ms is None


def test_caller_id_is_the_dedup_key(spec: JobSpec) -> None:
    message = encode_job(spec, 1, job_id="order-17")
    assert (message.id, message.dedup) == ("order-17", True)


@pytest.mark.parametrize("bad_id", ["", "a b", "line\r\nX-Forged: 1", "x" * 201, 17])
def test_bad_ids_are_rejected(spec: JobSpec, bad_id: Any) -> None:
    with pytest.raises(JobError) as caught:
        encode_job(spec, 1, job_id=bad_id)
    assert caught.value.code == "job.invalid_id"


@pytest.mark.parametrize("payload", [object(), {1, 2}, b"bytes", float("nan"), {"x": float("inf")}])
def test_non_json_payloads_are_rejected(spec: JobSpec, payload: Any) -> None:
    with pytest.raises(JobError) as caught:
        encode_job(spec, payload)
    assert caught.value.code == "job.invalid_payload"


def test_a_delayed_message_says_when_it_is_due(spec: JobSpec) -> None:
    due_ms = int(time.time() * 1000) + 60_000
    assert encode_job(spec, {}, due_ms=due_ms).run_at_ms == due_ms


def test_a_due_time_in_the_past_runs_now(spec: JobSpec) -> None:
    assert encode_job(spec, {}, due_ms=int(time.time() * 1000) - 5).run_at_ms is None


def test_due_time_from_delay_or_run_at(spec: JobSpec) -> None:
    now_ms = time.time() * 1000
    assert due_ms_of(spec, None, None) is None
    assert abs(due_ms_of(spec, 2.5, None) - (now_ms + 2500)) < 100  # type: ignore[operator]
    assert abs(due_ms_of(spec, timedelta(seconds=3), None) - (now_ms + 3000)) < 100  # type: ignore[operator]
    run_at = datetime(2030, 1, 1, tzinfo=UTC)
    assert due_ms_of(spec, None, run_at) == int(run_at.timestamp() * 1000)


@pytest.mark.parametrize(
    ("delay", "run_at"),
    [
        (-1, None),
        ("5", None),
        (True, None),
        (None, datetime(2030, 1, 1)),  # naive: ambiguous
        (1, datetime(2030, 1, 1, tzinfo=UTC)),  # both
    ],
)
def test_bad_delays_are_rejected(spec: JobSpec, delay: Any, run_at: Any) -> None:
    with pytest.raises(JobError) as caught:
        due_ms_of(spec, delay, run_at)
    assert caught.value.code == "job.invalid_delay"


def test_a_payload_over_its_cap_is_refused_naming_the_size_and_the_cap(spec: JobSpec) -> None:
    assert spec.max_payload_bytes == 1024 * 1024  # 1 MiB unless the class says otherwise
    fits = "x" * (1024 * 1024 - 2)  # with its quotes, exactly the cap
    assert len(encode_job(spec, fits).body) == 1024 * 1024
    with pytest.raises(JobError) as caught:
        encode_job(spec, fits + "x")
    assert caught.value.code == "job.payload_too_large"
    assert "payload is 1,048,577 bytes as JSON, over its max_payload_bytes (1,048,576)" in str(
        caught.value
    )
    small = validate_job(type("Small", (EmailJob,), {"max_payload_bytes": 10}), BUSES)
    with pytest.raises(JobError, match="over its max_payload_bytes \\(10\\)"):
        encode_job(small, {"to": "a@b.c"})


def test_a_payload_nested_too_deep_is_an_invalid_payload_not_a_recursion_error(
    spec: JobSpec,
) -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(JobError) as caught:
        encode_job(spec, deep)
    assert caught.value.code == "job.invalid_payload"
    assert "nested too deep" in str(caught.value)


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "1MiB"])
def test_max_payload_bytes_must_be_a_positive_int(cap: Any) -> None:
    with pytest.raises(RegistrationError, match="max_payload_bytes: must be a positive int"):
        validate_job(type("Capped", (EmailJob,), {"max_payload_bytes": cap}), BUSES)


async def test_job_enqueue_many_and_the_old_delay_spelling_warns_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mega import deprecation
    from mega.testing import memory_context

    monkeypatch.setattr(deprecation, "_warned", set())
    ctx = memory_context("jobs")
    ids = await EmailJob.enqueue_many(ctx, [{"n": 1}, {"n": 2}], key="acme")
    stats = await queue_of(ctx, "jobs").stats(EmailJob)
    assert (len(set(ids)), stats.pending) == (2, 2)

    with pytest.warns(
        DeprecationWarning,
        match=r"Job\.enqueue\(delay_s=\.\.\.\) is deprecated "
        r"and goes in mega 0\.3: use Job\.enqueue\(delay=\.\.\.\)",
    ):
        old = await EmailJob.enqueue(ctx, {"n": 3}, delay_s=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second use stays quiet
        await EmailJob.enqueue(ctx, {"n": 4}, delay_s=60)
    new = await EmailJob.enqueue(ctx, {"n": 5}, delay=timedelta(minutes=1))
    for job_id in (old, new):  # both held a minute
        status = await EmailJob.status(ctx, job_id)
        assert status is not None and status.state == "delayed"
        assert status.due_at is not None and status.enqueued_at is not None
        assert status.due_at - status.enqueued_at == 60_000
