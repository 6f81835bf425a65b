"""mega/lanes/middleware.py: a run as a pipeline of middlewares, on the memory driver (the
contract suite runs them on every driver: tests/mega/jobs/test_contract.py), the config's
checks of what it lists, and the jobs chapter's example."""

from __future__ import annotations

import logging
import runpy
from pathlib import Path
from typing import Any

import pytest

from mega import CallNext, Context, Event, Listener, ReceivedEvent, Run
from mega.config import load_config
from mega.drivers.base import Delivery
from mega.errors import ConfigError
from mega.lanes.middleware import chain
from mega.testing import drain, memory_context
from tests.mega.runtime.test_config import GOOD, write

ROOT = Path(__file__).resolve().parents[3]


def a_run(payload: Any = None) -> Run:
    delivery = Delivery("j1", "s", b"null", 2, None, None, 1, None, flow_key="acme")
    return Run("Invoice", "job", payload, delivery)


async def test_the_first_middleware_is_the_outermost_and_sees_the_result() -> None:
    order: list[str] = []

    def named(name: str) -> Any:
        async def middleware(run: Run, call_next: CallNext) -> Any:
            order.append(f"{name} before")
            result = await call_next(run)
            order.append(f"{name} after {result}")
            return f"{name}({result})"

        return middleware

    async def innermost(run: Run) -> Any:
        order.append("run")
        return run.payload

    call = chain([named("a"), named("b")], innermost)
    assert await call(a_run("x")) == "a(b(x))"
    assert order == ["a before", "b before", "run", "b after x", "a after b(x)"]
    run = a_run()
    assert (run.id, run.attempt, run.subject, run.key) == ("j1", 2, "s", "acme")
    assert repr(run) == "Run(job 'Invoice', id='j1', attempt=2)"


async def test_no_middleware_is_the_run_itself() -> None:
    async def innermost(run: Run) -> Any:
        return run.payload

    assert chain([], innermost) is innermost


class Signup(Event):
    name = "mw.signup"
    bus = "jobs"


GREETED: list[tuple[str, Any]] = []


class Greet(Listener):
    event = Signup
    group = "greeter"

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        GREETED.append((event.data["user"], event.data.get("stamped")))


async def test_a_listeners_runs_go_through_the_middlewares_too() -> None:
    seen: list[tuple[str, str, int]] = []

    async def stamp(run: Run, call_next: CallNext) -> Any:
        seen.append((run.kind, run.name, run.attempt))
        run.payload = {**run.payload, "stamped": True}  # the event's data
        return await call_next(run)

    ctx = memory_context(middlewares=[stamp])
    await Signup.emit(ctx, {"user": "ada"})
    report = await drain(ctx, listeners=[Greet])
    assert report.count("greeter", "done") == 1
    assert seen == [("event", "greeter", 1)]
    assert GREETED == [("ada", True)]


class Timing:
    async def __call__(self, run: Run, call_next: CallNext) -> Any:
        return await call_next(run)


def plain(run: Run, call_next: CallNext) -> Any:
    return call_next(run)


async def one_argument(run: Run) -> Any:
    return None


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ("Timing", "middlewares: item 0: Timing is a class: list an instance of it, Timing()"),
        ("plain", "middlewares: item 0: <function plain at"),
        ("one_argument", "must take two arguments: (run, call_next)"),
        (
            "Timing(), 42",
            "middlewares: item 1: 42 is not a middleware: give an object with "
            "`async def __call__(self, run, call_next)`",
        ),
    ],
)
def test_the_config_names_what_is_not_a_middleware(
    tmp_path: Path, listed: str, expected: str
) -> None:
    body = (
        "from tests.mega.lanes.test_middleware import Timing, plain, one_argument\n"
        f"middlewares = [{listed}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, GOOD + body))
    assert expected in str(info.value)


def test_the_config_hands_its_middlewares_to_the_hosts(tmp_path: Path) -> None:
    body = "from tests.mega.lanes.test_middleware import Timing\nmiddlewares = [Timing()]\n"
    config = load_config(write(tmp_path, GOOD + body))
    assert [type(m).__name__ for m in config.middlewares] == ["Timing"]


def test_the_guides_example_runs_a_job_through_both(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="app.timing"):
        runpy.run_path(str(ROOT / "docs/guide/examples/middlewares.py"), run_name="__main__")
    assert capsys.readouterr().out == "invoice 7 for acme\n"
    [line] = [r.getMessage() for r in caplog.records if r.name == "app.timing"]
    assert line.startswith("Invoice ") and " attempt 1 done in " in line
