"""Event and Listener classes are checked at registration, every problem named at once (pure)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from mega import Context, Event, EventBus, Listener, ReceivedEvent, outbox
from mega.errors import EventError, JobError, RegistrationError
from mega.events.listener import validate_listener
from mega.events.spec import encode_event, validate_event
from mega.testing import memory_context
from tests.processes import unmeasured_env

BUSES, CACHES = {"jobs"}, {"main"}


class Payload(BaseModel):
    email: str


class Signed(Event):
    name = "user.signed_up"
    bus = "jobs"
    schema = Payload


class Good(Listener):
    event = Signed

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        return None


def listener(**attrs: Any) -> type[Listener]:
    return type("Variant", (Good,), attrs)


def test_a_good_listener_and_what_it_derives() -> None:
    spec = validate_listener(Good, BUSES, CACHES)
    assert (spec.group, spec.bus, spec.pattern, spec.max_attempts) == (
        "Good",
        "jobs",
        "user.signed_up",
        4,
    )


@pytest.mark.parametrize(
    ("attrs", "field"),
    [
        ({"event": "bad pattern"}, "event"),
        ({"event": 42}, "event"),
        ({"event": "user.*", "bus": None}, "bus"),
        ({"group": "a group"}, "group"),
        ({"concurrency": 0}, "concurrency"),
        ({"retries": True}, "retries"),
        ({"backoff": {"type": "fixed"}}, "backoff"),
        ({"ack_wait_s": 0}, "ack_wait_s"),
        ({"dlq_max_age_s": -1}, "dlq_max_age_s"),
        ({"inbox": "nope"}, "inbox"),
        ({"inbox_ttl_s": 0}, "inbox_ttl_s"),
        ({"run": 42}, "run"),
        ({"rate_limit": {"limit": 5, "period_s": 1, "per": "key"}}, "rate_limit"),  # no keys
        ({"flow_cache": ""}, "flow_cache"),
    ],
)
def test_a_bad_listener_names_the_field(attrs: dict[str, Any], field: str) -> None:
    with pytest.raises(RegistrationError) as caught:
        validate_listener(listener(**attrs), BUSES, CACHES)
    assert f" {field}: " in str(caught.value)


def test_patterns_and_a_bus_for_them() -> None:
    spec = validate_listener(listener(event="user.>", bus="jobs"), BUSES, CACHES)
    assert spec.pattern == "user.>"
    with pytest.raises(RegistrationError, match=r"subclass of mega\.Listener"):
        validate_listener(object, BUSES, CACHES)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attrs", "field"),
    [({"name": "a b"}, "name"), ({"bus": "nope"}, "bus"), ({"schema": dict}, "schema")],
)
def test_a_bad_event_names_the_field(attrs: dict[str, Any], field: str) -> None:
    with pytest.raises(RegistrationError, match=f" {field}: "):
        validate_event(type("Bad", (Signed,), attrs), BUSES)
    with pytest.raises(RegistrationError, match=r"subclass of mega\.Event"):
        validate_event(int, BUSES)  # type: ignore[arg-type]


def test_the_payload_is_checked_against_the_schema_and_as_json() -> None:
    spec = validate_event(Signed, BUSES)
    message = encode_event(spec, {"email": "a@b.co"}, event_id="e1", emitted_at_ms=7)
    assert message.subject == "user.signed_up" and message.body == b'{"email":"a@b.co"}'
    assert (message.id, message.enqueued_at_ms, message.dedup) == ("e1", 7, True)
    with pytest.raises(JobError, match="does not match Payload"):
        encode_event(spec, {"mail": "x"})
    plain = validate_event(type("Plain", (Event,), {"name": "x.y", "bus": "jobs"}), BUSES)
    with pytest.raises(JobError, match="JSON-serialisable"):
        encode_event(plain, {"when": object()})


def test_an_inbox_is_a_cache_alias_or_db_with_a_database() -> None:
    assert validate_listener(listener(inbox="main"), BUSES, CACHES).inbox == "main"
    assert validate_listener(listener(inbox="db"), BUSES, CACHES, database=True).inbox == "db"
    with pytest.raises(RegistrationError) as caught:
        validate_listener(listener(inbox="db"), BUSES, CACHES)
    assert str(caught.value).endswith(
        'inbox: "db" keeps the inbox in the database, and none is configured (services.database)'
    )
    with pytest.raises(RegistrationError) as caught:
        validate_listener(listener(inbox="nope"), BUSES, CACHES, database=True)
    assert str(caught.value).endswith(
        "inbox: 'nope' is not a declared cache alias (declared: main), or \"db\" for the database"
    )


@pytest.mark.parametrize("attribute", ["db", "inbox"])
def test_an_event_says_which_inbox_its_group_lacks(attribute: str) -> None:
    event = ReceivedEvent("e1", "user.signed_up", {}, None, attempt=1)
    with pytest.raises(EventError) as caught:
        getattr(event, attribute)
    assert caught.value.code == "event.no_inbox"
    assert str(caught.value).startswith(f"user.signed_up: event.{attribute} is the ")


BAD_IDS = ["", "a b", "line\r\nX-Forged: 1", "tab\there", "x" * 201, "p" * 5000, 17]


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_an_event_id_is_checked_as_a_job_id_is(bad_id: Any) -> None:
    """Refused, never altered: whatever a driver builds of an id must stay within its engine's
    limits, and a CR/LF would forge a header."""
    spec = validate_event(Signed, BUSES)
    with pytest.raises(EventError) as caught:
        encode_event(spec, {"email": "a@b.co"}, event_id=bad_id)
    assert caught.value.code == "event.invalid_id"
    assert len(str(caught.value)) < 300  # names the id without repeating all of it
    assert encode_event(spec, {"email": "a@b.co"}, event_id="x" * 200).id == "x" * 200


async def test_every_way_to_emit_checks_the_id_before_anything_is_stored() -> None:
    ctx = memory_context()
    with pytest.raises(EventError) as by_function:
        await Signed.emit(ctx, {"email": "a@b.co"}, id="p" * 5000)
    with pytest.raises(EventError) as by_bus:
        await EventBus(ctx, "jobs").emit(Signed, {"email": "a@b.co"}, id="two words")
    with pytest.raises(EventError) as by_outbox:  # before the session is touched
        outbox.add(None, Signed, {"email": "a@b.co"}, id="cr\rlf")  # type: ignore[arg-type]
    codes = {error.value.code for error in (by_function, by_bus, by_outbox)}
    assert codes == {"event.invalid_id"}
    assert not ctx.buses["jobs"].broker.events  # type: ignore[attr-defined]  # nothing stored


def test_an_event_payload_over_its_cap_or_too_deep_is_refused() -> None:
    spec = validate_event(type("Plain", (Event,), {"name": "x.y", "bus": "jobs"}), BUSES)
    with pytest.raises(EventError) as caught:
        encode_event(spec, "x" * (1024 * 1024))
    assert caught.value.code == "event.payload_too_large"
    assert "1,048,578 bytes as JSON, over its max_payload_bytes (1,048,576)" in str(caught.value)
    deep: Any = {}
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(EventError) as nested:
        encode_event(spec, deep)
    assert nested.value.code == "event.invalid_payload"
    capped = type("Capped", (Event,), {"name": "x.z", "bus": "jobs", "max_payload_bytes": 8})
    with pytest.raises(EventError, match="over its max_payload_bytes \\(8\\)"):
        encode_event(validate_event(capped, BUSES), {"long": True})


def test_events_and_listeners_import_no_sqlalchemy_until_a_listener_uses_the_database() -> None:
    """A config of events and listeners that keep no database inbox loads without SQLAlchemy
    (a third of a second less start-up for every command and host); a `db` inbox imports it."""
    script = (
        "import asyncio, sys\n"
        "from mega import Event, Listener, ListenerRunner\n"
        "from mega.testing import memory_context\n"
        "class Signed(Event):\n"
        "    name = 'user.signed_up'\n"
        "    bus = 'jobs'\n"
        "class Mailer(Listener):\n"
        "    event = Signed\n"
        "    async def run(self, event, ctx): pass\n"
        "async def main():\n"
        "    runner = ListenerRunner(memory_context())\n"
        "    runner.register(Mailer)\n"
        "    await runner.start()\n"
        "    await runner.stop(5)\n"
        "asyncio.run(main())\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'sqlalchemy')[:1])\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=unmeasured_env(),
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "[]"
