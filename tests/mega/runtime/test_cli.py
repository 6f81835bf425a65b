"""The `mega` command run as a user runs it: real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mega.drivers.embedded import free_port
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.redis.embedded import EmbeddedRedis
from tests.factories import DECLARATIONS, write_config
from tests.processes import alive, descendants, wait_for_text

ROOT = Path(__file__).resolve().parents[3]
MEGA = [sys.executable, "-m", "mega"]
# A CPU pool of two child processes, declared in the config as an application would.
TWO_CHILD_POOL = """
from mega import Worker

class Pool(Worker):
    task_file = "tests.mega.workers.worker_tasks"
    pool_size = 2

workers = [Pool]
"""


def run_mega(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEGA, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("command", ["start", "scheduler", "worker", "dev", "check", "dlq"])
def test_every_command_has_help(command: str) -> None:
    result = run_mega(command, "--help")
    assert result.returncode == 0
    assert "--config" in result.stdout


def test_unreachable_nats_is_one_clear_line_from_the_web_app(
    tmp_path: Path, redis_url: str
) -> None:
    """The web app ends at once (a load balancer sends nothing to a process that is not up);
    the worker and the scheduler wait for their servers (below)."""
    command = "start"
    closed = f"127.0.0.1:{free_port()}"
    config = write_config(tmp_path, nats_url=f"nats://{closed}", redis_url=redis_url)
    result = run_mega(command, "--config", str(config))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"mega {command}: error: cannot reach")
    assert closed in lines[0] and "mega dev" in lines[0] and "docker compose up" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("command", ["worker", "scheduler"])
def test_a_host_started_before_its_server_waits_for_it_then_runs(
    tmp_path: Path, redis_url: str, nats_url: str, command: str
) -> None:
    """Started before its server (a reboot, a deploy), a host says what it waits for, tries
    again with a backoff, and runs once the server answers; a stop while it waits is a normal
    stop (exit 0)."""
    port = free_port()
    nats = f"nats://127.0.0.1:{port}" if command == "worker" else nats_url
    redis = f"redis://127.0.0.1:{port}/0" if command == "scheduler" else redis_url
    config = write_config(tmp_path, nats_url=nats, redis_url=redis, body=DECLARATIONS)
    log = tmp_path / "host.log"
    server_kind = EmbeddedNats if command == "worker" else EmbeddedRedis
    server = server_kind(data_dir=tmp_path / "server", port=port)
    with log.open("wb") as out:
        host = subprocess.Popen(
            [*MEGA, command, "--config", str(config)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        waits = f"{command} waits for its services: cannot reach"
        wait_for_text(log.read_text, waits, 2, 30, while_alive=host.pid)  # tried again
        text = log.read_text()
        assert f"127.0.0.1:{port}" in text and "trying again in 1 s" in text
        assert "trying again in 2 s" in text and "Traceback" not in text
        server.start()
        running = "running 1 schedule" if command == "scheduler" else "consuming 1 job"
        wait_for_text(log.read_text, rf"{command} \S+ {running}", 1, 60, while_alive=host.pid)
        host.send_signal(signal.SIGTERM)
        assert host.wait(60) == 0, log.read_text()
    finally:
        if host.poll() is None:
            host.kill()
        server.stop()


def test_a_host_waiting_for_its_server_stops_at_a_signal(tmp_path: Path, redis_url: str) -> None:
    config = write_config(tmp_path, nats_url=f"nats://127.0.0.1:{free_port()}", redis_url=redis_url)
    log = tmp_path / "host.log"
    with log.open("wb") as out:
        host = subprocess.Popen(
            [*MEGA, "worker", "--config", str(config)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_text(log.read_text, "worker waits for its services", 1, 30, while_alive=host.pid)
        host.send_signal(signal.SIGTERM)
        assert host.wait(30) == 0, log.read_text()
        assert "SIGTERM received while starting: worker stopped" in log.read_text()
    finally:
        if host.poll() is None:
            host.kill()


def test_bad_config_key_is_named(tmp_path: Path) -> None:
    config = tmp_path / "cfg.py"
    config.write_text('services = {"caches": {"main": {"driver": "memcached", "url": "x"}}}\n')
    result = run_mega("worker", "--config", str(config), env={"MEGA_SECRET_KEY": "k" * 40})
    assert result.returncode == 2
    assert "services.caches.main.driver" in result.stderr and "Traceback" not in result.stderr


# Three mistakes in three classes; the listener's refused, its event is heard by none.
BROKEN = (
    DECLARATIONS
    + "Tidy.cron = '61 * * * *'\nEmail.subject = 'email send'\nWelcome.bus = 'elsewhere'\n"
)
# Nothing listens on port 1: a command that connected would say it cannot reach NATS or Redis.
CLOSED_NATS, CLOSED_REDIS = "nats://127.0.0.1:1", "redis://127.0.0.1:1/0"


def test_check_prints_every_problem_at_once_and_exits_1(tmp_path: Path) -> None:
    config = write_config(tmp_path, nats_url=CLOSED_NATS, redis_url=CLOSED_REDIS, body=BROKEN)
    result = run_mega("check", "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        "error: schedules: Tidy: schedule 'Tidy' is invalid: cron: invalid cron expression "
        "'61 * * * *': [61 * * * *] is not acceptable, out of range",
        "error: jobs: Email: job 'Email' is invalid: subject: letters, digits, '.', '_' and '-' "
        "only, got 'email send'",
        "error: listeners: Welcome: listener 'Welcome' is invalid: bus: 'elsewhere' is not a "
        "declared bus alias (declared: jobs)",
        "warning: events: Signup: no listener hears 'user.signed_up': its events are relayed and "
        "kept for a group that may come later; add a Listener to `listeners`, or drop it from "
        "`events`",
        "mega check: 3 errors, 1 warning",
    ]


def test_check_of_a_good_config_exits_0_with_a_summary(tmp_path: Path) -> None:
    config = write_config(tmp_path, nats_url=CLOSED_NATS, redis_url=None)
    result = run_mega("check", "--config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "mega check: 0 schedules, 0 jobs, 0 workers, 0 events, 0 listeners ok\n"
    sample = run_mega("check", "--config", str(ROOT / "mega_config.py"))
    assert sample.returncode == 0 and sample.stdout.startswith("mega check: 1 schedule, 7 jobs")


def test_a_reader_that_left_ends_a_command_quietly_with_141(tmp_path: Path) -> None:
    """`mega jobs inspect ID | grep -q running`: grep leaves at its first match. The command
    then ends as a tool killed by SIGPIPE does (141), saying nothing: no internal error."""
    config = write_config(tmp_path, nats_url=CLOSED_NATS, redis_url=None)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        result = subprocess.run(
            [*MEGA, "check", "--config", str(config)],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (141, "")


def test_only_a_broken_standard_output_counts_as_its_reader_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another broken pipe (a server's socket) stays an error the command reports."""
    from mega.runtime.cli import _stdout_reader_gone

    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not _stdout_reader_gone()  # its reader is there
        os.close(read)
        assert _stdout_reader_gone()


def test_a_config_that_does_not_load_is_one_error_for_check(tmp_path: Path) -> None:
    config = tmp_path / "cfg.py"
    config.write_text('services = {"caches": {"main": {"driver": "memcached", "url": "x"}}}\n')
    result = run_mega("check", "--config", str(config))
    assert result.returncode == 1
    assert result.stdout.startswith("error: config: services.caches.main.driver: ")


@pytest.mark.parametrize("command", ["worker", "scheduler", "work"])
def test_a_host_names_a_bad_class_before_it_reaches_a_server(tmp_path: Path, command: str) -> None:
    config = write_config(tmp_path, nats_url=CLOSED_NATS, redis_url=CLOSED_REDIS, body=BROKEN)
    result = run_mega(command, "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"mega {command}: error: 3 problems in mega_config.py:\n")
    assert "error: jobs: Email: job 'Email' is invalid: subject: " in result.stderr
    assert "cannot reach" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_start_stops_gracefully_on_signal_and_exits_0(
    tmp_path: Path, nats_url: str, redis_url: str, sig: signal.Signals
) -> None:
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=TWO_CHILD_POOL)
    port = free_port()
    web = subprocess.Popen(
        [*MEGA, "start", "--port", str(port), "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        pool_pids = descendants(web.pid)
        assert len(pool_pids) == 2  # the pool's two child processes
        web.send_signal(sig)
        output, _ = web.communicate(timeout=30)
        assert web.returncode == 0, output
        assert "web stopped" in output and "Traceback" not in output
        time.sleep(0.2)
        assert [pid for pid in pool_pids if alive(pid)] == []
    finally:
        if web.poll() is None:
            web.kill()
            web.communicate()


# A start hook that says it began, then holds the host's start far longer than any test.
SLOW_START = """
import pathlib, time

def hold(runtime, ctx):
    pathlib.Path({marker!r}).touch()
    time.sleep(0.5)  # blocking: the signal lands while the start is in a call, not an await

async def hold_async(runtime, ctx):
    import asyncio
    await asyncio.Event().wait()  # held until the signal stops the host

hooks = {{{host!r}: [hold, hold_async]}}
"""


@pytest.mark.parametrize("command", ["worker", "start"])
def test_a_signal_while_the_host_starts_stops_it_cleanly(
    tmp_path: Path, nats_url: str, command: str
) -> None:
    marker = tmp_path / "starting"
    host = {"worker": "worker", "start": "web"}[command]
    body = SLOW_START.format(marker=str(marker), host=host)
    config = write_config(tmp_path, nats_url=nats_url, redis_url=None, body=body)
    args = ["--port", str(free_port())] if command == "start" else []
    process = subprocess.Popen(
        [*MEGA, command, "--config", str(config), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, "no start hook ran"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # during the first hook's blocking call
        output, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, output
    assert f"SIGTERM received while starting: {host} stopped" in output, output
    assert "Traceback" not in output


def test_json_logs_are_one_object_per_line_with_the_event_fields(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    import json

    body = "from tests.app.cluster_schedules import EverySecond\nschedules = [EverySecond]\n"
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    log = tmp_path / "scheduler.log"
    with open(log, "wb") as out:
        scheduler = subprocess.Popen(
            [*MEGA, "scheduler", "--json-logs", "--config", str(config)],
            cwd=ROOT,
            env={**os.environ, "CLUSTER_PREFIX": prefix},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # Its first tick ran.
        wait_for_text(log.read_text, "run schedule=EverySecond", 1, 60, while_alive=scheduler.pid)
        scheduler.send_signal(signal.SIGTERM)
        scheduler.wait(timeout=30)
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
    output = log.read_text()
    assert scheduler.returncode == 0, output
    entries = [json.loads(line) for line in output.splitlines()]  # every line is JSON
    assert {"ts", "level", "logger", "message"} <= set(entries[0])
    runs = [e["message"] for e in entries if e["logger"] == "mega.signals"]
    assert any(
        m.startswith("run schedule=EverySecond") and "fence=" in m and "instance=" in m
        for m in runs
    )
    assert entries[-1]["message"] == "scheduler stopped"


def test_a_traced_host_prints_its_spans_and_its_json_logs_name_them(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    """`OTEL_TRACES_EXPORTER=console`: each span is a JSON line on stdout, a tick the parent of
    the job it enqueued; the JSON logs (stderr) carry each signal's fields as keys, with the
    trace and span ids of the span they were logged in."""
    import json

    body = (
        "from tests.mega.runtime.traced_app import Echo, EnqueueEverySecond\n"
        "schedules = [EnqueueEverySecond]\njobs = [Echo]\n"
    )
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "MEGA_LOG_LEVEL": "DEBUG"}
    env.pop("OTEL_SERVICE_NAME", None)
    stdout, stderr = tmp_path / "spans.jsonl", tmp_path / "logs.jsonl"

    def echoes_done() -> int:
        lines = stderr.read_text().splitlines() if stderr.exists() else []
        return sum('"signal": "done"' in line and '"job": "Echo"' in line for line in lines)

    with stdout.open("w") as out_file, stderr.open("w") as err_file:
        host = subprocess.Popen(
            [*MEGA, "work", "--with-scheduler", "--json-logs", "--config", str(config)],
            cwd=ROOT,
            env=env,
            stdout=out_file,
            stderr=err_file,
        )
        try:
            deadline = time.monotonic() + 60
            while echoes_done() < 2:  # a few ticks, each with its job done
                assert host.poll() is None and time.monotonic() < deadline, stderr.read_text()
                time.sleep(0.1)
            host.send_signal(signal.SIGTERM)
            host.wait(timeout=30)
        finally:
            if host.poll() is None:
                host.kill()
                host.wait()
    out, err = stdout.read_text(), stderr.read_text()
    assert host.returncode == 0, err
    spans = [json.loads(line) for line in out.splitlines()]  # every line of stdout: a span
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"mega-work"}
    by_id = {s["context"]["span_id"]: s for s in spans}
    runs = [s for s in spans if s["name"] == "process traced.echo"]
    assert runs, [s["name"] for s in spans]
    for run in runs:
        send = by_id[run["parent_id"]]
        tick = by_id[send["parent_id"]]
        assert (send["name"], tick["name"]) == ("send traced.echo", "tick EnqueueEverySecond")
        assert run["context"]["trace_id"] == tick["context"]["trace_id"]
        assert tick["parent_id"] is None  # a scheduled tick starts its trace
    logs = [json.loads(line) for line in err.splitlines()]  # every line of stderr: JSON
    done = [e for e in logs if e.get("signal") == "done" and e.get("job") == "Echo"]
    assert done, [e["message"] for e in logs]
    for entry in done:
        assert {"id", "attempt", "worker", "duration_ms", "trace_id", "span_id"} <= set(entry)
        assert entry["attempt"] == 1 and isinstance(entry["duration_ms"], float)
        assert entry["worker"].startswith("work@")
        span = by_id["0x" + entry["span_id"]]  # the run's own span
        assert span["name"] == "process traced.echo"
        assert span["context"]["trace_id"] == "0x" + entry["trace_id"]
        assert span["attributes"]["messaging.message.id"] == entry["id"]


@pytest.mark.parametrize("command", ["start", "dev"])
def test_port_in_use_is_one_clear_line(
    tmp_path: Path, nats_url: str, redis_url: str, command: str
) -> None:
    import socket

    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_mega(command, "--port", str(port), "--config", str(config))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in output and "--port" in output
    assert "Traceback" not in output
