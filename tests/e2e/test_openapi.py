"""schemathesis against the live stack's own OpenAPI description, with a logged-in session: for
generated (and deliberately wrong) input, no route answers 500, and every answer is in the
envelope and matches the schema its route declares (status, content type, body)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.e2e.conftest import ONE_BUS, LiveStack
from tests.factories import DEMO_PASSWORD, DEMO_USER

# The pool hash runs up to 50,000,000 rounds per call (seconds of CPU each): its bounds and
# bad input have their own tests (tests/app/test_worker_demo.py); fuzzing it would only be slow.
SLOW = "/api/demo/worker/hash"
# "Every schema-valid request is accepted" is left out: `format: email` in JSON Schema admits
# addresses that email-validator refuses on purpose (reserved domains such as `x@a.test`), and
# such a refusal is a 422 with the field named, which the other checks hold the route to.
ACCEPTANCE = positive_data_acceptance
# Job modes that would change the stack under the tests after this one: a crash job ends the
# stack's one worker (no `mega dev` here to start it again), slow ones hold its slots for 15 s.
DISRUPTIVE_MODES = ("crash", "slow")


@pytest.fixture(scope="module")
def session(live_stack: LiveStack) -> requests.Session:
    http = requests.Session()
    page = http.get(f"{live_stack.url}/login").text
    found = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert found is not None
    token = found.group(1)
    http.post(
        f"{live_stack.url}/login",
        data={"username": DEMO_USER, "password": DEMO_PASSWORD, "csrf_token": token},
    )
    csrf = re.search(
        r'name="csrf-token" content="([^"]+)"', http.get(f"{live_stack.url}/demo").text
    )
    assert csrf is not None
    http.headers["X-CSRF-Token"] = csrf.group(1)
    return http


@ONE_BUS
@pytest.mark.slow
def test_every_route_keeps_its_contract(session: requests.Session, live_stack: LiveStack) -> None:
    document = session.get(f"{live_stack.url}/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document).exclude(path=SLOW)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()
        operations.append(result.ok())
    assert len(operations) >= 10  # every JSON route of the sample but the slow one
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
        def keeps_its_contract(case: Any) -> None:
            if isinstance(case.body, dict) and case.body.get("mode") in DISRUPTIVE_MODES:
                case.body["mode"] = "ok"
            response = case.call_and_validate(
                base_url=live_stack.url, session=session, excluded_checks=[ACCEPTANCE]
            )
            body = response.json()
            assert isinstance(body, dict) and isinstance(body.get("ok"), bool), body
            assert "meta" in body, body

        keeps_its_contract()


def test_the_relay_is_left_running(session: requests.Session, live_stack: LiveStack) -> None:
    """The fuzzing may have paused the outbox relay: the page tests that follow need it on."""
    answer = session.post(f"{live_stack.url}/api/demo/events/relay", json={"paused": False})
    assert answer.status_code == 200
