"""What the nats driver keeps where, a job's message on the wire, and which node a client tries
next (pure, no broker)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

import pytest
from nats.aio.client import Server
from nats.js.api import PubAck
from nats.js.errors import APIError

from mega.constants import NATS_RECONNECT_WAIT_S
from mega.drivers.base import DriverUnavailable, Lane, Message
from mega.drivers.nats.bus import job_envelope
from mega.drivers.nats.connection import Reconnects
from mega.drivers.nats.core import stored
from mega.drivers.nats.names import (
    HEADER_ENQUEUED_AT,
    HEADER_FLOW_KEY,
    HEADER_JOB_ID,
    HEADER_RUN_AT,
    NATS_MSG_ID,
    bucket_of,
    dlq_stream_name,
    dlq_stream_of,
    dlq_subject_of,
    durable_of,
    filter_subjects_of,
    job_id_of,
    record_key,
    record_subject,
    requeue_subject_of,
    stream_name,
    stream_of,
)
from mega.drivers.nats.settle import requeue_headers

JOB = Lane("job", "EmailJob", "demo.email", 2, 30.0, 3600.0)
GROUP = Lane("group", "Good", "user.signed_up", 1, 30.0, 3600.0)


@pytest.mark.parametrize(
    ("subject", "stream"),
    [
        ("demo.email", "MEGA_JOBS_demo_email"),
        ("a-b_c.d", "MEGA_JOBS_a_b_c_d"),
        ("X9", "MEGA_JOBS_X9"),
    ],
)
def test_stream_names(subject: str, stream: str) -> None:
    assert stream_name(subject) == stream
    assert dlq_stream_name(subject) == stream + "_DLQ"


def test_a_job_lane_lives_in_its_own_streams() -> None:
    assert (stream_of(JOB), dlq_stream_of(JOB), dlq_subject_of(JOB)) == (
        "MEGA_JOBS_demo_email",
        "MEGA_JOBS_demo_email_DLQ",
        "demo.email.dlq",
    )
    assert (durable_of(JOB), requeue_subject_of(JOB)) == ("mega_workers", "demo.email")


def test_a_group_lane_is_a_consumer_of_the_events_stream() -> None:
    assert (stream_of(GROUP), durable_of(GROUP)) == ("MEGA_EVENTS", "mega_group_Good")
    assert filter_subjects_of(GROUP) == ["events.user.signed_up", "events_requeue.Good"]
    assert (dlq_subject_of(GROUP), dlq_stream_of(GROUP)) == (
        "events_dlq.Good",
        "MEGA_EVENTS_GOOD_DLQ",
    )
    assert requeue_headers(GROUP, "e1", "user.signed_up", 5, 9) == {
        "Mega-Event-Id": "e1",
        "Mega-Event-Name": "user.signed_up",
        "Mega-Emitted-At": "5",
        "Mega-Run-At": "9",
    }


def test_a_lanes_records_are_a_bucket_per_table() -> None:
    assert (bucket_of(JOB, "status"), bucket_of(JOB, "result")) == (
        "MEGA_JOBS_demo_email_STATUS",
        "MEGA_JOBS_demo_email_RESULT",
    )
    assert bucket_of(GROUP, "status") == "MEGA_EVENTS_GOOD_STATUS"
    assert record_subject("B", "a.b") == "$KV.B.=YS5i"


@pytest.mark.parametrize(
    ("job_id", "key"),
    [
        ("order-17_b", "order-17_b"),  # a plain token stays readable
        ("a.b", "=YS5i"),  # one token, not two
        ("=x", "=PXg"),  # never mistaken for an encoded key
        ("*", "=Kg"),
        (">", "=Pg"),
        ("order:42/ship", "=b3JkZXI6NDIvc2hpcA"),
        ("ünï-✓", "=w7xuw68t4pyT"),
        ("w" * 200, "w" * 200),
    ],
)
def test_a_job_id_is_a_record_key_both_ways(job_id: str, key: str) -> None:
    assert record_key(job_id) == key
    assert job_id_of(key) == job_id
    assert re.fullmatch(r"[-/_=.A-Za-z0-9]+", key) and "." not in key


def test_envelope_of_a_plain_job() -> None:
    now = int(time.time() * 1000)
    subject, body, headers = job_envelope(Message("j1", "demo.email", b"{}", now, dedup=False))
    assert (subject, body) == ("demo.email", b"{}")
    assert headers == {HEADER_ENQUEUED_AT: str(now), HEADER_JOB_ID: "j1"}  # no dedup key


def test_a_caller_id_is_the_dedup_key() -> None:
    _, _, headers = job_envelope(Message("order-17", "demo.email", b"1", 1))
    assert headers[HEADER_JOB_ID] == headers["Nats-Msg-Id"] == "order-17"


def test_a_jobs_key_and_trace_context_are_headers() -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    job = Message(
        "order-17", "demo.email", b"{}", 1234, trace={"traceparent": traceparent}, flow_key="k"
    )
    assert job_envelope(job) == (
        "demo.email",
        b"{}",
        {
            HEADER_ENQUEUED_AT: "1234",
            NATS_MSG_ID: "order-17",
            HEADER_JOB_ID: "order-17",
            HEADER_FLOW_KEY: "k",
            "traceparent": traceparent,
        },
    )


def test_a_delayed_job_is_a_broker_schedule() -> None:
    due_ms = int(time.time() * 1000) + 60_000
    subject, _, headers = job_envelope(Message("j", "demo.email", b"{}", 1, due_ms))
    assert subject.startswith("demo.email._delay.")
    assert headers["Nats-Schedule-Target"] == "demo.email"
    assert headers[HEADER_RUN_AT] == str(due_ms)
    at = datetime.strptime(headers["Nats-Schedule"], "@at %Y-%m-%dT%H:%M:%S.%fZ")
    assert abs(at.replace(tzinfo=UTC).timestamp() * 1000 - due_ms) < 1


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (PubAck(stream="S", seq=1), True),
        (PubAck(stream="S", seq=1, duplicate=True), False),
        # A publish whose Nats-Msg-Id an earlier one still being stored carries: a duplicate.
        (
            APIError(code=409, err_code=10158, description="duplicate message id is in process"),
            False,
        ),
    ],
)
def test_what_a_publish_answer_says(answer: Any, expected: bool) -> None:
    assert stored(answer) is expected


@pytest.mark.parametrize(
    "answer",
    [APIError(code=503, err_code=10077, description="no responders"), TimeoutError()],
)
def test_any_other_failed_publish_is_the_bus_unavailable(answer: BaseException) -> None:
    with pytest.raises(DriverUnavailable):
        stored(answer)


def test_after_losing_a_node_the_client_tries_the_others_first_then_pauses_between_rounds() -> None:
    pool = [Server(urlparse(f"nats://{netloc}")) for netloc in ("a:1", "b:2", "c:3")]
    watch = Reconnects()
    watch.server = "a:1"
    watch.lost()
    assert watch.disconnects == 1
    tries = [watch.choose(pool, {}) for _ in range(4)]
    assert [server.uri.netloc for server, _ in tries] == ["b:2", "c:3", "a:1", "b:2"]
    assert [delay_s for _, delay_s in tries[:2]] == [0.0, 0.0]  # never tried: at once
    # the lost node, and a second round, only after a pause since each was last tried
    assert all(0 < delay_s <= NATS_RECONNECT_WAIT_S for _, delay_s in tries[2:])
