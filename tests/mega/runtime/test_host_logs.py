"""The hosts' signal log lines: one line per signal whatever the user text in it (no forged
lines, no hidden characters), plain values left as they are; an outage said once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mega import Context, Job, JobRunner
from mega.runtime.logs import SUMMARY_EVERY_S, TextFormatter, observe_signals
from mega.signals import Signals
from mega.testing import fake_clock, memory_context
from tests.factories import write_config

ROOT = Path(__file__).resolve().parents[3]


class Runtime:
    def __init__(self) -> None:
        self.signals = Signals({"fail", "done"})

    def on(self, name: str, observer: Any) -> None:
        self.signals.on(name, observer)


async def test_user_text_cannot_forge_or_hide_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    runtime = Runtime()
    observe_signals(runtime, ("fail", "done"))
    forged = "bad\n23:59:59 INFO     mega.signals: done job=EmailJob id=FORGED0001"
    with caplog.at_level(logging.INFO, logger="mega.signals"):
        await runtime.signals.emit("fail", job="EmailJob", id="j1", error=forged, to="a\u202eb")
        await runtime.signals.emit("done", job="EmailJob", id="j2", attempt=1)
    lines = caplog.text.splitlines()
    assert len(lines) == 2  # one per signal: the newline did not start a line
    assert (
        'error="bad\\n23:59:59 INFO     mega.signals: done job=EmailJob id=FORGED0001"' in lines[0]
    )
    assert 'to="a\\u202eb"' in lines[0]  # the bidi override shows as an escape
    assert lines[1].endswith("done job=EmailJob id=j2 attempt=1")  # plain values unchanged


async def test_an_outbox_relay_without_its_table_says_so_once_with_the_fix(
    tmp_path: Path, nats_url: str, prefix: str
) -> None:
    """The relay retries every second; the host's log says the cause once, not every second
    (each retry's `error` signal is a DEBUG line, counted in the summary)."""
    path = write_config(tmp_path, nats_url=nats_url, redis_url=None, body=RELAY_BODY)
    log = tmp_path / "worker.log"
    env = {**os.environ, "FAULT_PREFIX": prefix, "MEGA_LOG_LEVEL": "DEBUG"}
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "mega", "worker", "--json-logs", "--config", str(path)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while len([r for r in records(log) if r.get("signal") == "error"]) < 3:
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"fewer than 3 relay retries\n{log.read_text()}"
            await asyncio.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, log.read_text()
    said = [r for r in records(log) if "no such table" in r["message"]]
    retries = [r for r in said if r.get("signal") == "error"]
    assert len(retries) >= 3 and {r["level"] for r in retries} == {"debug"}
    [warning] = [r for r in said if r.get("signal") != "error"]
    assert warning["level"] == "warning"
    assert "run `mega db upgrade`, or start the web app" in warning["message"]


RELAY_BODY = """
from tests.mega.events.fault_events import GroupA, Happened
events = [Happened]
listeners = [GroupA]
"""


def records(log: Path) -> list[dict[str, Any]]:
    """The log's JSON records (a line still being written is left for the next read)."""
    found = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


def test_a_text_line_says_its_time_in_utc_with_its_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Seoul")  # 9 h ahead of UTC, no summer time
    time.tzset()
    try:
        record = logging.LogRecord("mega.worker", logging.INFO, __file__, 1, "up", None, None)
        record.created = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC, 09:00 in Seoul
        line = TextFormatter().format(record)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert line == "00:00:00Z INFO    mega.worker: up"


class Counted(Job):
    subject = "logs.counted"
    bus = "jobs"

    async def run(self, payload: int, ctx: Context) -> None:
        COUNTED.append(payload)


COUNTED: list[int] = []
WORKER_SIGNALS = ("start", "done", "retry", "fail", "dlq", "cancel")


async def test_a_worker_counts_its_runs_for_the_summary_without_a_signal_for_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At INFO, a worker host's start and done are counted by the consume loops and summed
    for the summary line: neither signal is built (bench/bench_budget.py: a quarter of a
    no-op job's time); the others are observed as before."""
    COUNTED.clear()
    caplog.set_level(logging.INFO, logger="mega.signals")
    with fake_clock() as clock:
        runner = JobRunner(memory_context("jobs"))
        runner.register(Counted)
        log = observe_signals(runner, WORKER_SIGNALS, routine=("start", "done"), worker="w1")
        assert log.tallied == ("start", "done")
        assert [runner.signals.has_observers(name) for name in WORKER_SIGNALS] == [
            False,
            False,
            True,
            True,
            True,
            True,
        ]
        summaries = asyncio.create_task(log.every())
        await runner.start()
        try:
            await Counted.enqueue_many(runner.ctx, range(3))
            for _ in range(1000):
                if len(COUNTED) == 3:
                    break
                await asyncio.sleep(0)
            assert sorted(COUNTED) == [0, 1, 2]
            await clock.advance(SUMMARY_EVERY_S)
            assert "last 10 s: start=3 done=3" in caplog.text
            caplog.clear()
            await clock.advance(SUMMARY_EVERY_S)  # nothing ran: no line
            assert "last" not in caplog.text
        finally:
            summaries.cancel()
            await runner.stop(1)


async def test_with_debug_lines_on_each_run_is_a_line_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    COUNTED.clear()
    caplog.set_level(logging.DEBUG, logger="mega.signals")
    runner = JobRunner(memory_context("jobs"))
    runner.register(Counted)
    log = observe_signals(runner, WORKER_SIGNALS, routine=("start", "done"), worker="w1")
    assert log.tallied == ()
    await runner.start()
    try:
        job_id = await Counted.enqueue(runner.ctx, 7)
        deadline = time.monotonic() + 5
        while f"done job=Counted id={job_id} attempt=1" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.01)
        assert f"start job=Counted id={job_id} attempt=1" in caplog.text
    finally:
        await runner.stop(1)
