"""One trace from a request to the jobs its event causes, on every driver, with the OpenTelemetry
SDK's in-memory exporter: the sample's signup (HTTP) adds its event to the outbox, the relay
publishes it, each of the four listener groups runs it, and the welcome listener enqueues an
e-mail job that a worker runs. A listener's retried attempts link to the attempt before."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.events.listeners import LISTENERS
from mega.config import Config, load_config
from tests.factories import DEMO_PASSWORD, DEMO_USER, authed, sample_config, worker_parts_on

pytestmark = pytest.mark.postgres

DRIVERS = ["nats", "redis", "postgres", "memory"]
GROUPS = sorted(listener.__name__ for listener in LISTENERS)


@pytest.fixture(params=DRIVERS)
def config(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    nats_factory: Callable[[], Any],
    redis_factory: Callable[[], Any],
) -> Config:
    nats_url, redis_url = nats_factory().url, redis_factory().url
    driver = request.param
    if driver == "postgres":
        bus = {"driver": "postgres", "url": request.getfixturevalue("postgres_url")}
    elif driver == "memory":
        bus = {"driver": "memory"}
    else:
        bus = {"driver": driver, "url": nats_url if driver == "nats" else redis_url}
    return load_config(sample_config(tmp_path, nats_url=nats_url, redis_url=redis_url, bus=bus))


@asynccontextmanager
async def one_process(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    """The web app and what `mega worker` runs (relay, listener groups, job worker) on one
    context, behind an in-process client: the memory bus is one process's."""
    from mega.runtime.bootstrap import boot, shutdown
    from mega.runtime.web_host import load_web_app
    from mega.web import ensure_user

    ctx = await boot(config, role="web")
    try:
        ensure_user(ctx.db, DEMO_USER, DEMO_PASSWORD)
        app = load_web_app(config)(config, ctx)
        transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 5555))
        async with (
            worker_parts_on(config, ctx),
            httpx.AsyncClient(transport=transport, base_url="http://testserver") as client,
        ):
            yield client
    finally:
        await shutdown(ctx)


def attribute(span: Any, name: str) -> Any:
    return (span.attributes or {}).get(name)


async def finished(
    spans: Any, check: Callable[[list[Any]], bool], timeout_s: float = 30
) -> list[Any]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = list(spans.get_finished_spans())
        if check(found):
            return found
        assert asyncio.get_running_loop().time() < deadline, sorted(s.name for s in found)
        await asyncio.sleep(0.1)


def runs(found: list[Any], name: str, group: str | None = None) -> list[Any]:
    return [
        s
        for s in found
        if s.name == f"process {name}" and attribute(s, "messaging.consumer.group.name") == group
    ]


async def test_one_trace_from_the_request_to_the_job_its_event_caused(
    config: Config, spans: Any
) -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    async with one_process(config) as client:
        headers = await authed(client, "/demo/events")
        answer = await client.post(
            "/api/demo/events/signup", json={"email": "ada@example.com"}, headers=headers
        )
        assert answer.status_code == 201, answer.text
        event_id = answer.json()["data"]["event_id"]
        answer = await client.post(
            "/api/demo/events/signup", json={"email": "fail-bo@example.com"}, headers=headers
        )
        assert answer.status_code == 201, answer.text
        found = await finished(
            spans,
            lambda found: (
                len(runs(found, "demo.email")) == 2
                and len(runs(found, "user.signed_up", "CrmSyncListener")) == 4
            ),  # 1 + 3 attempts
        )

    by_id = {s.context.span_id: s for s in found}
    [post] = [
        s
        for s in found
        if s.kind == SpanKind.SERVER
        and attribute(s, "http.route") == "/api/demo/events/signup"
        and any(
            c.name == "outbox.add user.signed_up"
            and c.parent.span_id == s.context.span_id
            and attribute(c, "messaging.message.id") == event_id
            for c in found
        )
    ]
    trace = [s for s in found if s.context.trace_id == post.context.trace_id]

    def children(parent: Any, name: str) -> list[Any]:
        return [
            s
            for s in trace
            if s.name == name and s.parent and s.parent.span_id == parent.context.span_id
        ]

    [add] = children(post, "outbox.add user.signed_up")
    assert add.kind == SpanKind.PRODUCER
    assert attribute(add, "messaging.operation.type") == "create"
    [publish] = children(add, "publish user.signed_up")
    assert attribute(publish, "messaging.message.id") == event_id
    driver = config.buses["jobs"].driver
    assert attribute(publish, "messaging.system") == {"postgres": "postgresql"}.get(driver, driver)
    groups = children(publish, "process user.signed_up")
    assert sorted(attribute(s, "messaging.consumer.group.name") for s in groups) == GROUPS
    assert all(
        s.kind == SpanKind.CONSUMER and s.status.status_code != StatusCode.ERROR for s in groups
    )
    [welcome] = [
        s for s in groups if attribute(s, "messaging.consumer.group.name") == "WelcomeEmailListener"
    ]
    [send] = children(welcome, "send demo.email")
    [email] = children(send, "process demo.email")
    assert attribute(email, "messaging.message.id") == "w" + event_id[:11]
    assert attribute(email, "mega.attempt") == 1
    assert all(s.parent is None or s.parent.span_id in by_id for s in trace)  # nothing orphaned

    # The rejected signup: three attempts of the CRM group, each linked to the one before.
    crm = sorted(
        (
            s
            for s in runs(found, "user.signed_up", "CrmSyncListener")
            if s.context.trace_id != post.context.trace_id
        ),
        key=lambda s: attribute(s, "mega.attempt"),
    )
    assert [attribute(s, "mega.attempt") for s in crm] == [1, 2, 3]
    assert all(s.status.status_code == StatusCode.ERROR for s in crm)
    assert len({s.parent.span_id for s in crm}) == 1  # all three: children of its publish
    assert crm[0].links == ()
    for before, after in itertools.pairwise(crm):
        [link] = after.links
        assert link.context.span_id == before.context.span_id
        assert link.context.trace_id == before.context.trace_id
