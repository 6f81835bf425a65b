"""`make check` leaves out exactly the tests that start a server or a host of their own (the
`server` mark, set by tests/conftest.py at collection), and keeps the rest: the contract suites
on the memory driver, the web app in process, the pure logic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SERVER_MODULES
from tests.processes import unmeasured_env
from tests.tools.tiers import KEPT, LEFT

ROOT = Path(__file__).resolve().parents[2]


def collected() -> tuple[list[str], list[str]]:
    """The node ids of the whole suite that `make check` keeps and those it leaves out (the
    `server` mark), from one `pytest --collect-only`: each item as the conftest marked it,
    written by `-s` (collection's output is not captured then) with a prefix of its own."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-s", "-p", "tests.tools.tiers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a hang's bound: the collection takes 10 s on a quiet 2-core machine
        env=unmeasured_env(),  # a collection, not mega's code: not measured
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    kept = [line.removeprefix(KEPT) for line in lines if line.startswith(KEPT)]
    left = [line.removeprefix(LEFT) for line in lines if line.startswith(LEFT)]
    return kept, left


@pytest.mark.timeout(600)  # a collection of the whole suite, on a machine that may be busy
def test_check_keeps_the_memory_driver_and_leaves_every_server_test_to_make_test() -> None:
    kept, left = collected()
    assert len(kept) > 1000 and len(left) > 500  # the whole suite, each test once
    assert set(kept).isdisjoint(left)
    contract = "tests/mega/jobs/test_contract.py::"
    assert any(test.startswith(contract) and test.endswith("[memory]") for test in kept)
    for driver in ("nats", "redis", "redis-cluster", "postgres"):
        assert not [test for test in kept if test.startswith(contract) and f"[{driver}]" in test]
        assert any(test.startswith(contract) and test.endswith(f"[{driver}]") for test in left)
    scenarios = "tests/mega/jobs/test_silent_faults.py::test_a_silent_node_is_left"  # slow
    marked = ("tests/e2e/", scenarios, "tests/ops/test_compose_up.py")
    for folder in marked:
        assert not [test for test in kept if test.startswith(folder)], folder
        assert any(test.startswith(folder) for test in left), folder
    for module in SERVER_MODULES:
        assert not [test for test in kept if module in test], module
        assert any(module in test for test in left), module
    # a test that asks for servers of its own by fixture, to stop and start them again
    health = "tests/mega/web/test_health.py::"
    own = f"{health}test_readyz_names_the_dependency_that_is_down_and_recovers"
    assert own in left and own not in kept
    assert any(test.startswith(health) for test in kept)
