"""ecosystem/: the Procfile, supervisord.conf and the systemd units run the same three commands,
and the first two really run: the shipped files, the real `mega` hosts on private servers, a
signal to the manager, and nothing left behind."""

from __future__ import annotations

import configparser
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mega.drivers.embedded import EmbeddedServer, free_port
from tests.factories import DEMO_PASSWORD, DEMO_USER, TEST_SECRET
from tests.processes import (
    alive,
    command_line,
    descendants,
    free_port_base,
    wait_for_status,
    wait_for_text,
)

ROOT = Path(__file__).resolve().parents[2]
ECOSYSTEM = ROOT / "ecosystem"
BIN = Path(sys.executable).parent  # the virtualenv running the tests: mega, honcho, supervisord
BOOT_TIMEOUT_S = 60
# The last line each host logs before it waits for SIGINT/SIGTERM (its handlers are set in the
# same step): a signal sent earlier would find a host still booting.
SCHEDULER_READY = r"mega\.host: scheduler \S+ running"
WORKER_READY = r"mega\.host: worker \S+ consuming"


@pytest.fixture
def stack_env(
    tmp_path: Path,
    nats_factory: Callable[[], EmbeddedServer],
    redis_factory: Callable[[], EmbeddedServer],
) -> dict[str, str]:
    """What an operator exports: URLs of private servers, secrets, the venv's `mega` on PATH.
    The test runner's own MEGA_*/NATS_*/REDIS_* settings are left out."""
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MEGA_", "NATS_", "REDIS_"))
        and key not in ("DATABASE_URL", "HOST", "PORT")
    }
    return {
        **inherited,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "NATS_URL": nats_factory().url,
        "REDIS_URL": redis_factory().url,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'ops.db'}",
        "MEGA_CONFIG": str(ROOT / "mega_config.py"),
        "MEGA_SECRET_KEY": TEST_SECRET,
        "MEGA_DEMO_USER": DEMO_USER,
        "MEGA_DEMO_PASSWORD": DEMO_PASSWORD,
    }


def mega_commands(pids: set[int]) -> list[str]:
    """The `mega ...` arguments of every mega host among `pids`, sorted."""
    marker = f"{BIN / 'mega'} "  # argv: the venv's python, then the `mega` script
    lines = (command_line(pid) for pid in pids)
    return sorted(line.split(marker, 1)[1] for line in lines if marker in line)


def stop_and_wait(process: subprocess.Popen[bytes], sig: signal.Signals, timeout_s: float) -> int:
    process.send_signal(sig)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


def tail(*paths: Path, chars: int = 3000) -> str:
    """The end of each log that exists, for failure messages."""
    return "\n".join(
        f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}"
        for path in paths
        if path.exists()
    )


def kill_leftovers(pids: set[int]) -> list[int]:
    """SIGKILL whatever of `pids` still runs; returns them."""
    left = sorted(pid for pid in pids if alive(pid))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def clean_up(manager: subprocess.Popen[bytes], family: set[int]) -> None:
    """After a failure too: the manager stops its programs (SIGTERM; a SIGKILLed manager would
    orphan them), then whatever is left of its family is SIGKILLed."""
    family |= descendants(manager.pid)
    if manager.poll() is None:
        manager.terminate()
        try:
            manager.wait(60)
        except subprocess.TimeoutExpired:
            manager.kill()
            manager.wait()
    kill_leftovers(family)


# -- the same three commands everywhere ------------------------------------------------------


def test_procfile_runs_the_three_commands() -> None:
    entries = {}
    for line in (ECOSYSTEM / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            entries[name] = command.strip()
    assert entries == {
        "web": "exec mega start --port $PORT",
        "scheduler": "MEGA_SCHEDULER_METRICS_PORT=$PORT exec mega scheduler",
        "worker": "MEGA_WORKER_METRICS_PORT=$PORT exec mega worker",
    }


class CaseKeepingParser(configparser.RawConfigParser):
    """Keeps systemd's CamelCase keys (RawConfigParser lowercases them)."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


def read_ini(path: Path) -> configparser.RawConfigParser:
    parser = CaseKeepingParser(inline_comment_prefixes=(";",), strict=False)
    parser.read(path)
    return parser


def test_supervisord_runs_the_three_commands_with_a_graceful_stop() -> None:
    config = read_ini(ECOSYSTEM / "supervisord.conf")
    programs = {s.removeprefix("program:"): config[s] for s in config if s.startswith("program:")}
    assert {name: p["command"] for name, p in programs.items()} == {
        "web": "mega start",
        "scheduler": "mega scheduler",
        "worker": "/bin/sh -c 'MEGA_WORKER_METRICS_PORT=$((${MEGA_WORKER_METRICS_PORT:-9102}"
        " + %(process_num)d)) exec mega worker'",
    }
    assert programs["worker"]["numprocs"] == "2"
    # The hosts drain for up to 30 s (the web app: uvicorn's 10 s, then its CPU pools).
    assert {name: p["stopwaitsecs"] for name, p in programs.items()} == {
        "web": "40",
        "scheduler": "45",
        "worker": "45",
    }
    for name, program in programs.items():
        assert program["stopsignal"] == "TERM", name
        assert program["autorestart"] == "true", name
        assert program["directory"] == "%(here)s/..", name


@pytest.mark.parametrize(
    ("unit", "exec_start", "stop_timeout_s"),
    [
        ("mega-web.service", "/opt/mega/.venv/bin/mega start", "40"),
        ("mega-scheduler.service", "/opt/mega/.venv/bin/mega scheduler", "45"),
        ("mega-worker@.service", "/opt/mega/.venv/bin/mega worker", "45"),
    ],
)
def test_systemd_units_run_the_three_commands(
    unit: str, exec_start: str, stop_timeout_s: str
) -> None:
    service = read_ini(ECOSYSTEM / "systemd" / unit)["Service"]
    assert service["ExecStart"] == exec_start
    assert service["EnvironmentFile"] == "/etc/mega/mega.env"
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # a config error: a restart cannot fix it
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"
    assert service["TimeoutStopSec"] == stop_timeout_s
    assert service["WorkingDirectory"] == "/opt/mega"
    assert service["User"] == "mega"


def test_each_worker_instance_serves_metrics_on_its_own_port() -> None:
    service = read_ini(ECOSYSTEM / "systemd" / "mega-worker@.service")["Service"]
    assert service["Environment"] == "MEGA_WORKER_METRICS_PORT=%i"


def test_supervisord_names_the_missing_run_dir() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MEGA_RUN_DIR"}
    result = subprocess.run(
        [BIN / "supervisord", "-n", "-c", ECOSYSTEM / "supervisord.conf"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 2
    assert "ENV_MEGA_RUN_DIR" in result.stderr


# -- really running them ---------------------------------------------------------------------


@pytest.mark.slow
def test_honcho_runs_the_procfile_and_sigint_stops_everything(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    # honcho's ports: web gets $PORT, the scheduler +100, the two workers +200 and +201.
    port = free_port_base(0, 100, 200, 201)
    no_dotenv = tmp_path / "empty.env"  # a developer's ./.env must not leak into the test
    no_dotenv.write_text("")
    log_path = tmp_path / "honcho.log"
    with log_path.open("wb") as log:
        honcho = subprocess.Popen(
            [
                BIN / "honcho",
                "--no-colour",
                "-e",
                no_dotenv,
                "-f",
                "ecosystem/Procfile",
                "-d",
                ROOT,
                "start",
                "-c",
                "worker=2",
            ],
            cwd=ROOT,
            env={**stack_env, "PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    family: set[int] = set()
    try:
        for url in (
            f"http://127.0.0.1:{port}/readyz",
            f"http://127.0.0.1:{port + 100}/metrics",
            f"http://127.0.0.1:{port + 200}/metrics",
            f"http://127.0.0.1:{port + 201}/metrics",
        ):
            wait_for_status(
                url, 200, BOOT_TIMEOUT_S, while_alive=honcho.pid, logs=lambda: tail(log_path)
            )
        for pattern, count in ((SCHEDULER_READY, 1), (WORKER_READY, 2)):
            wait_for_text(log_path.read_text, pattern, count, 30, while_alive=honcho.pid)
        family = descendants(honcho.pid)
        assert mega_commands(family) == ["scheduler", f"start --port {port}", "worker", "worker"]

        assert stop_and_wait(honcho, signal.SIGINT, 60) == 130  # honcho's code for SIGINT
        output = log_path.read_text()
        stopped = dict(re.findall(r"(\S+) stopped \(rc=(-?\d+)\)", output))
        # Every host drained and exited 0 (not SIGKILLed by honcho after its 5 s).
        assert stopped == {
            "web.1": "0",
            "scheduler.1": "0",
            "worker.1": "0",
            "worker.2": "0",
        }, tail(log_path)
        assert "Traceback" not in output
        time.sleep(0.2)
        assert kill_leftovers(family) == []
    finally:
        clean_up(honcho, family)


PROGRAMS = ("web", "scheduler", "worker-0", "worker-1")  # supervisord's process names


def supervisor_status(env: dict[str, str]) -> dict[str, str]:
    result = subprocess.run(
        [BIN / "supervisorctl", "-c", ECOSYSTEM / "supervisord.conf", "status"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    return dict(line.split()[:2] for line in result.stdout.splitlines() if line.strip())


@pytest.mark.slow
def test_supervisord_runs_the_shipped_config_and_sigterm_stops_everything(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    web_port, scheduler_port = free_port(), free_port()
    worker_port = free_port_base(0, 1)  # worker-0 and worker-1 listen on it and the next one
    env = {
        **stack_env,
        "MEGA_RUN_DIR": str(run_dir),
        "PORT": str(web_port),
        "MEGA_SCHEDULER_METRICS_PORT": str(scheduler_port),
        "MEGA_WORKER_METRICS_PORT": str(worker_port),
    }
    output = tmp_path / "supervisord.out"
    logs = [output, *(run_dir / f"{name}.log" for name in ("supervisord", *PROGRAMS))]
    with output.open("wb") as out:
        supervisord = subprocess.Popen(
            [BIN / "supervisord", "-n", "-c", ECOSYSTEM / "supervisord.conf"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    family: set[int] = set()
    try:
        for url in (
            f"http://127.0.0.1:{web_port}/readyz",
            f"http://127.0.0.1:{scheduler_port}/metrics",
            f"http://127.0.0.1:{worker_port}/metrics",
            f"http://127.0.0.1:{worker_port + 1}/metrics",
        ):
            wait_for_status(
                url, 200, BOOT_TIMEOUT_S, while_alive=supervisord.pid, logs=lambda: tail(*logs)
            )
        for pattern, count in ((SCHEDULER_READY, 1), (WORKER_READY, 2)):
            wait_for_text(
                lambda: tail(*logs, chars=10**6), pattern, count, 30, while_alive=supervisord.pid
            )
        expected = {
            "scheduler": "RUNNING",
            "web": "RUNNING",
            "worker:worker-0": "RUNNING",
            "worker:worker-1": "RUNNING",
        }
        deadline = time.monotonic() + 30  # STARTING until each has lived `startsecs`
        while (status := supervisor_status(env)) != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status == expected, tail(*logs)
        family = descendants(supervisord.pid)
        assert mega_commands(family) == ["scheduler", "start", "worker", "worker"]

        assert stop_and_wait(supervisord, signal.SIGTERM, 90) == 0
        log = (run_dir / "supervisord.log").read_text()
        stopped = dict(re.findall(r"stopped: (\S+) \((.+?)\)", log))
        assert stopped == dict.fromkeys(PROGRAMS, "exit status 0"), tail(*logs)
        time.sleep(0.2)
        assert kill_leftovers(family) == []
        # Its files live under MEGA_RUN_DIR; socket and pid file go away with it.
        assert sorted(p.name for p in run_dir.iterdir()) == [
            "scheduler.log",
            "supervisord.log",
            "web.log",
            "worker-0.log",
            "worker-1.log",
        ]
        for name in PROGRAMS:
            assert "Traceback" not in (run_dir / f"{name}.log").read_text(), name
    finally:
        clean_up(supervisord, family)


@pytest.mark.slow
def test_honcho_runs_the_single_layout_with_one_mega_work(
    tmp_path: Path, stack_env: dict[str, str]
) -> None:
    port = free_port_base(0, 100)  # web gets $PORT, work +100
    no_dotenv = tmp_path / "empty.env"
    no_dotenv.write_text("")
    log_path = tmp_path / "honcho.log"
    with log_path.open("wb") as log:
        honcho = subprocess.Popen(
            [
                BIN / "honcho",
                "--no-colour",
                "-e",
                no_dotenv,
                "-f",
                "ecosystem/Procfile.single",
                "-d",
                ROOT,
                "start",
            ],
            cwd=ROOT,
            env={**stack_env, "PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    family: set[int] = set()
    try:
        for url in (f"http://127.0.0.1:{port}/readyz", f"http://127.0.0.1:{port + 100}/metrics"):
            wait_for_status(
                url, 200, BOOT_TIMEOUT_S, while_alive=honcho.pid, logs=lambda: tail(log_path)
            )
        for pattern in (r"mega\.host: work \S+ running", r"mega\.host: work \S+ consuming"):
            wait_for_text(log_path.read_text, pattern, 1, 30, while_alive=honcho.pid)
        family = descendants(honcho.pid)
        assert mega_commands(family) == [f"start --port {port}", "work --with-scheduler"]
        assert stop_and_wait(honcho, signal.SIGINT, 60) == 130
        output = log_path.read_text()
        assert dict(re.findall(r"(\S+) stopped \(rc=(-?\d+)\)", output)) == {
            "web.1": "0",
            "work.1": "0",
        }, tail(log_path)
        assert "Traceback" not in output
        time.sleep(0.2)
        assert kill_leftovers(family) == []
    finally:
        clean_up(honcho, family)
