"""The suite's xdist groups hold: every test of a group runs on one worker (tests/conftest.py).

A group that silently stopped holding (as the `xdist_group` mark did under pytest 9.2) would
let two compose stacks or two restart loops run at once, and nothing would say so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.processes import unmeasured_env

ROOT = Path(__file__).resolve().parents[2]
WORKER = re.compile(r"^\[(gw\d+)\] .*?(PASSED|FAILED|SKIPPED|ERROR) (\S+)", re.MULTILINE)


def test_every_test_of_a_group_runs_on_one_worker() -> None:
    grouped = "tests/ops/test_compose.py"  # the compose group: fast checks of the files
    ungrouped = "tests/tools/test_chromium.py"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            grouped,
            ungrouped,
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-k",
            "not docker_compose_up",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=unmeasured_env(),  # how the suite is spread, not mega's code: not measured
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    ran = [(worker, test) for worker, _, test in WORKER.findall(result.stdout)]
    compose = {worker for worker, test in ran if test.startswith(grouped)}
    assert len([test for _, test in ran if test.startswith(grouped)]) > 10
    assert len(compose) == 1, ran
