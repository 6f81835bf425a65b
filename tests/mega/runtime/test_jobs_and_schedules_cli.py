"""`mega jobs` and `mega schedules` on the session's NATS and Redis: what each prints, and the
one line and exit code of each mistake.

The happy paths call the command's entry function in this process (what `mega` runs once it
has parsed its arguments); the errors run `mega` itself, for the line and the exit code."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict

import pytest
from redis.asyncio import Redis

from mega import Job, chain
from mega.config import Config, load_config
from mega.drivers.embedded import free_port
from mega.jobs.queue import JobQueue
from mega.runtime.bootstrap import boot, shutdown
from mega.runtime.cli_audit import default_by
from mega.runtime.jobs_cli import JOB_ACTIONS, run_jobs_command
from mega.runtime.schedules_cli import SCHEDULE_ACTIONS, run_schedules_command
from mega.schedules.scheduler import Scheduler
from tests.factories import job_worker, write_config
from tests.mega.runtime.test_cli import run_mega

# One job that fails when asked to (not retried: one dead letter at once), a schedule with a
# lock and one without.
BODY = """
from mega import Job, Schedule

class MailJob(Job):
    subject = {subject!r}
    bus = "jobs"
    retries = 0

    async def run(self, payload, ctx):
        if payload.get("fail"):
            raise RuntimeError("mailbox full")

class Tidy(Schedule):
    cron = "0 3 * * *"
    timezone = "Asia/Seoul"
    lock = {{"lock": "main", "ttl": 20_000, "key": {key!r}}}

    async def run(self, ctx): ...

class Everywhere(Schedule):
    cron = "*/5 * * * *"
    timezone = "UTC"

    async def run(self, ctx): ...

jobs = [MailJob]
schedules = [Tidy, Everywhere]
"""
# The bus "jobs" on Redis instead of the NATS that write_config declares.
ON_REDIS = 'services["buses"]["jobs"] = {{"driver": "redis", "url": {url!r}}}\n'


@pytest.fixture(params=["nats", "redis"])
def config(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> Config:
    body = BODY.format(subject=f"ctl.{prefix}.mail", key=prefix)
    if request.param == "redis":
        body += ON_REDIS.format(url=redis_url)
    return load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))


@pytest.fixture
def schedules_config(tmp_path: Path, nats_url: str, redis_url: str, prefix: str) -> Config:
    body = BODY.format(subject=f"ctl.{prefix}.mail", key=prefix)
    return load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))


@pytest.fixture
async def queue(config: Config) -> AsyncIterator[JobQueue]:
    ctx = await boot(config, role="test", database=False)
    try:
        yield JobQueue(ctx, "jobs")
    finally:
        await shutdown(ctx)


async def mega(config: Config, *args: str) -> tuple[int, str, str]:
    done = await asyncio.to_thread(run_mega, *args, "--config", str(config.path))
    return done.returncode, done.stdout, done.stderr


async def until_state(queue: JobQueue, config: Config, job_id: str, state: str) -> None:
    (job,) = config.jobs
    deadline = time.monotonic() + 15
    while (status := await queue.status(job, job_id)) is None or status.state != state:
        assert time.monotonic() < deadline, f"{job_id} never reached {state}: {status}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "command",
    [("jobs", action) for action in JOB_ACTIONS]
    + [("schedules", action) for action in SCHEDULE_ACTIONS],
    ids=" ".join,
)
def test_every_action_has_help(command: tuple[str, str]) -> None:
    result = run_mega(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: mega {' '.join(command)} ")
    assert "--config" in result.stdout


# -- jobs -------------------------------------------------------------------------------------


async def test_stats_count_each_job_and_show_its_pause(
    config: Config, queue: JobQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    (job,) = config.jobs
    await queue.enqueue_many(job, [{"n": 1}, {"n": 2}])  # no worker: both wait
    await run_jobs_command(config, "stats", target=None, job=None, by=None)
    assert capsys.readouterr().out == (
        "MailJob: 2 pending, 0 in flight, 0 dead letter(s), not paused\n"
    )

    await run_jobs_command(config, "pause", target="MailJob", job=None, by="ada")
    assert capsys.readouterr().out == "MailJob: paused by ada\n"
    assert (await queue.paused(job)).by == "ada"
    await run_jobs_command(config, "stats", target=None, job="MailJob", by=None, as_json=True)
    line = json.loads(capsys.readouterr().out)
    assert line.pop("paused_at_ms") == pytest.approx(time.time() * 1000, abs=10_000)
    assert line == {
        "job": "MailJob",
        "pending": 2,
        "in_flight": 0,
        "dlq": 0,
        "approximate": False,
        "paused": True,
        "paused_by": "ada",
    }
    await run_jobs_command(config, "resume", target="MailJob", job=None, by=None)
    assert capsys.readouterr().out == f"MailJob: resumed by {default_by()}\n"
    assert (await queue.paused(job)).paused is False

    code, out, err = await mega(config, "jobs", "pause", "SendJob")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "mega jobs: error: JOB: no job named 'SendJob' in the config (jobs: MailJob)"
    ]


async def test_inspect_and_cancel_a_waiting_job_then_a_finished_one(
    config: Config, queue: JobQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    (job,) = config.jobs
    await queue.enqueue(job, {"n": 1}, id="wait-1")
    await run_jobs_command(config, "inspect", target="wait-1", job=None, by=None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "MailJob wait-1: queued"
    assert any(line.startswith("  enqueued at: ") for line in lines[1:])
    await run_jobs_command(config, "inspect", target="wait-1", job="MailJob", by=None, as_json=True)
    record = json.loads(capsys.readouterr().out)
    assert (record["job"], record["id"], record["state"]) == ("MailJob", "wait-1", "queued")

    await run_jobs_command(config, "cancel", target="wait-1", job=None, by=None)
    assert capsys.readouterr().out == "MailJob wait-1: cancelled\n"
    await run_jobs_command(config, "cancel", target="wait-1", job="MailJob", by=None)
    assert capsys.readouterr().out == "MailJob wait-1: already cancelled, nothing cancelled\n"

    async with job_worker(config):  # runs the next one, and skips the cancelled one
        await queue.enqueue(job, {"n": 2}, id="done-1")
        await until_state(queue, config, "done-1", "done")
    await run_jobs_command(config, "cancel", target="done-1", job=None, by=None)
    assert capsys.readouterr().out == "MailJob done-1: already done, nothing cancelled\n"
    cancelled = await queue.status(job, "wait-1")
    assert cancelled is not None and cancelled.state == "cancelled"

    code, out, err = await mega(config, "jobs", "inspect", "no-such-id")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "mega jobs: error: no job with id 'no-such-id' in MailJob: unknown, or its status "
        "record is older than the job's keep_status_s"
    ]


async def test_inspect_a_workflow_by_its_id(
    config: Config, queue: JobQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    (job,) = config.jobs
    assert issubclass(job, Job)
    flow = chain(job.step({"n": 1}), job.step({"fail": True}), job.step({"n": 3}))
    await flow.enqueue(queue.ctx, id="flow-1")
    async with job_worker(config):
        deadline = time.monotonic() + 15
        while not (status := await queue.status("flow-1")) or not status.final:
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.05)
    await run_jobs_command(config, "inspect", target="flow-1", job=None, by=None)
    assert capsys.readouterr().out.splitlines() == [
        "workflow flow-1: failed (chain of 3)",
        "  1 MailJob wf~flow-1~0: done",
        "  2 MailJob wf~flow-1~1: dlq RuntimeError: mailbox full",
        "  3 MailJob wf~flow-1~2: waiting",
    ]
    await run_jobs_command(config, "inspect", target="flow-1", job=None, by=None, as_json=True)
    record = json.loads(capsys.readouterr().out)
    assert (record["kind"], record["state"], len(record["steps"])) == ("chain", "failed", 3)


async def test_retry_requeues_that_dead_letter_once(
    config: Config, queue: JobQueue, capsys: pytest.CaptureFixture[str]
) -> None:
    (job,) = config.jobs
    async with job_worker(config):
        await queue.enqueue(job, {"fail": True}, id="dead-1")
        await until_state(queue, config, "dead-1", "dlq")
    await run_jobs_command(config, "retry", target="dead-1", job=None, by=None)
    assert capsys.readouterr().out == "MailJob dead-1: requeued\n"
    assert await queue.dlq.count(job) == 0
    assert (await queue.stats(job)).pending == 1

    code, out, err = await mega(config, "jobs", "retry", "dead-1", "--job", "MailJob")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "mega jobs: error: no dead letter with id 'dead-1' in MailJob "
        "(`mega dlq list --job MailJob` shows the ids)"
    ]


# -- schedules --------------------------------------------------------------------------------


async def test_schedules_list_pause_and_resume(
    schedules_config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    config = schedules_config
    await run_schedules_command(config, "list", name=None, by=None)
    tidy, everywhere = capsys.readouterr().out.splitlines()
    assert tidy.startswith("Tidy: '0 3 * * *' in Asia/Seoul, next ")
    assert tidy.endswith("T03:00:00+09:00, not paused")
    assert everywhere.startswith("Everywhere: '*/5 * * * *' in UTC, next ")
    assert everywhere.endswith(", no lock: runs on every scheduler, cannot be paused")

    await run_schedules_command(config, "pause", name="Tidy", by="ada")
    assert capsys.readouterr().out == "Tidy: paused by ada\n"
    await run_schedules_command(config, "list", name=None, by=None, as_json=True)
    tidy_json, everywhere_json = map(json.loads, capsys.readouterr().out.splitlines())
    assert tidy_json.pop("paused_at_ms") == pytest.approx(time.time() * 1000, abs=10_000)
    assert tidy_json.pop("next_run").endswith("T03:00:00+09:00")
    assert tidy_json == {
        "name": "Tidy",
        "cron": "0 3 * * *",
        "timezone": "Asia/Seoul",
        "lock": "main",
        "paused": True,
        "paused_by": "ada",
        "entries": [],
    }
    assert (everywhere_json["lock"], everywhere_json["paused"]) == (None, False)
    await run_schedules_command(config, "list", name=None, by=None)
    assert " paused by ada since " in capsys.readouterr().out.splitlines()[0]

    await run_schedules_command(config, "resume", name="Tidy", by=None)
    assert capsys.readouterr().out == f"Tidy: resumed by {default_by()}\n"
    ctx = await boot(config, role="test", database=False)
    try:
        scheduler = Scheduler(ctx)
        for schedule in config.schedules:
            scheduler.register(schedule)
        assert (await scheduler.paused("Tidy")).paused is False
        changes = [(t["source"], t["skipped"]) for t in await scheduler.recent_ticks("Tidy")]
    finally:
        await shutdown(ctx)
    assert [source for source, _ in changes] == ["resume", "pause"]
    (resumed,), (paused,) = (skipped for _, skipped in changes)
    assert paused["reason"] == "paused by ada" and paused["instance"].startswith("control@")
    assert resumed["reason"] == f"resumed by {default_by()}"
    # Each change is an audit row (who ran the command, not --by), which `mega audit list` shows.
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "mega",
            "audit",
            "list",
            "--target",
            "schedule:Tidy",
            "--config",
            str(config.path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    lines = [line.split("\t")[1:] for line in listed.stdout.splitlines()]
    who = f"cli:{default_by()}"
    assert lines == [[who, "resume", "schedule:Tidy"], [who, "pause", "schedule:Tidy"]]


async def test_schedules_errors_name_the_problem_and_the_fix(schedules_config: Config) -> None:
    code, out, err = await mega(schedules_config, "schedules", "pause", "Everywhere")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "mega schedules: error: schedule 'Everywhere' has no lock, so it cannot be paused: the "
        "pause is a record in the Redis of the schedule's lock, read by every scheduler; give "
        'the class a lock such as {"lock": "main", "ttl": 20000}'
    ]
    code, out, err = await mega(schedules_config, "schedules", "resume", "Nightly")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "mega schedules: error: NAME: no schedule named 'Nightly' in the config (schedules: "
        "Tidy, Everywhere)"
    ]


# -- dynamic entries --------------------------------------------------------------------------


class EntryFields(TypedDict):
    """What `mega schedules add` is told of a dynamic entry."""

    key: str
    cron_expr: str
    args: str


async def test_schedules_add_change_list_and_remove_an_entry(
    schedules_config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    config = schedules_config
    add: EntryFields = {"key": "acme", "cron_expr": "*/2 * * * * *", "args": '{"tenant": "acme"}'}
    await run_schedules_command(config, "add", name="Tidy", by="ada", **add)
    line = capsys.readouterr().out
    assert line.startswith("Tidy acme: added by ada, '*/2 * * * * *' in Asia/Seoul, next ")
    assert line.endswith(', args {"tenant": "acme"}\n')
    await run_schedules_command(
        config, "add", name="Tidy", by=None, key="acme", cron_expr="0 6 * * *", timezone="UTC"
    )
    line = capsys.readouterr().out
    assert line.startswith(f"Tidy acme: changed by {default_by()}, '0 6 * * *' in UTC, next ")
    assert line.endswith("T06:00:00+00:00, args {}\n")

    await run_schedules_command(config, "list", name=None, by=None)
    tidy, acme, everywhere = capsys.readouterr().out.splitlines()
    assert tidy.startswith("Tidy: '0 3 * * *' in Asia/Seoul")
    assert acme.startswith("  acme: '0 6 * * *' in UTC, next ")
    assert acme.endswith(f", args {{}}, by {default_by()}")
    assert everywhere.startswith("Everywhere: ")
    await run_schedules_command(config, "list", name=None, by=None, as_json=True)
    tidy_json, everywhere_json = map(json.loads, capsys.readouterr().out.splitlines())
    [entry] = tidy_json["entries"]
    assert entry.pop("at_ms") == pytest.approx(time.time() * 1000, abs=10_000)
    assert entry.pop("next_run").endswith("T06:00:00+00:00")
    assert entry == {
        "key": "acme",
        "cron": "0 6 * * *",
        "timezone": "UTC",
        "args": {},
        "by": default_by(),
    }
    assert everywhere_json["entries"] == []

    await run_schedules_command(config, "remove", name="Tidy", by="ada", key="acme")
    assert capsys.readouterr().out == "Tidy acme: removed by ada\n"
    await run_schedules_command(config, "list", name=None, by=None)
    assert len(capsys.readouterr().out.splitlines()) == 2
    code, out, err = await mega(config, "schedules", "remove", "Tidy", "--key", "acme")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "mega schedules: error: Tidy has no entry with key 'acme', nothing removed "
        "(`mega schedules list` shows them)"
    ]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["add", "Nightly", "--key", "acme", "--cron", "* * * * *"],
            "NAME: no schedule named 'Nightly' in the config (schedules: Tidy, Everywhere)",
        ),
        (
            ["add", "Tidy", "--key", "acme", "--cron", "* * *"],
            "entry 'acme' of schedule 'Tidy' is invalid: cron: cron expression '* * *' has 3 "
            "fields; expected 5",
        ),
        (
            ["add", "Tidy", "--key", "acme", "--cron", "* * * * *", "--timezone", "Mars/Base"],
            "entry 'acme' of schedule 'Tidy' is invalid: timezone: unknown time zone 'Mars/Base'",
        ),
        (
            ["add", "Tidy", "--key", "acme", "--cron", "* * * * *", "--args", "{tenant: acme}"],
            "--args: not JSON (Expecting property name enclosed in double quotes: line 1 "
            "column 2 (char 1)): '{tenant: acme}'",
        ),
        (
            ["add", "Tidy", "--key", "acme", "--cron", "* * * * *", "--args", "[1, 2]"],
            "entry 'acme' of schedule 'Tidy' is invalid: args: must be a JSON object (a dict "
            "with string keys), got [1, 2]",
        ),
        (
            ["add", "Tidy", "--key", "a b", "--cron", "* * * * *"],
            "entry 'a b' of schedule 'Tidy' is invalid: key: must be 1 to 128 letters, digits "
            "or . _ @ -, starting with a letter or digit, got 'a b'",
        ),
        (
            ["add", "Everywhere", "--key", "acme", "--cron", "* * * * *"],
            "schedule 'Everywhere' has no lock, so it cannot have dynamic entries: they are "
            "kept in the Redis of the schedule's lock, which also runs each of their ticks "
            'once; give the class a lock such as {"lock": "main", "ttl": 20000}',
        ),
        (
            ["remove", "Everywhere", "--key", "acme"],
            "schedule 'Everywhere' has no lock, so it cannot have dynamic entries: they are "
            "kept in the Redis of the schedule's lock, which also runs each of their ticks "
            'once; give the class a lock such as {"lock": "main", "ttl": 20000}',
        ),
    ],
    ids=["class", "cron", "zone", "json", "not-object", "key", "no-lock", "remove-no-lock"],
)
async def test_schedules_entry_errors_are_one_line_exit_2_and_change_nothing(
    schedules_config: Config, redis_url: str, prefix: str, args: list[str], error: str
) -> None:
    client = Redis.from_url(redis_url)
    try:
        code, out, err = await mega(schedules_config, "schedules", *args)
        assert (code, out) == (2, "")
        assert err.splitlines()[-1].startswith(f"mega schedules: error: {error}")
        assert len(err.splitlines()) == 1, err
        assert await client.keys(f"{prefix}*") == []
    finally:
        await client.aclose()


async def test_schedules_add_without_redis_is_one_line_exit_3(
    tmp_path: Path, nats_url: str
) -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}"
    body = BODY.format(subject="ctl.none.mail", key="none")
    config = load_config(
        write_config(tmp_path, nats_url=nats_url, redis_url=unreachable, body=body)
    )
    code, out, err = await mega(
        config, "schedules", "add", "Tidy", "--key", "a", "--cron", "* * * * *"
    )
    assert (code, out) == (3, "")
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("mega schedules: error: ") and "redis" in err.lower()


def test_add_and_remove_help_name_their_options() -> None:
    add = run_mega("schedules", "add", "--help").stdout
    for option in ("--key KEY", "--cron EXPR", "--timezone ZONE", "--args JSON", "--by WHO"):
        assert option in add
    remove = run_mega("schedules", "remove", "--help").stdout
    assert "--key KEY" in remove and "--by WHO" in remove and "--cron" not in remove


async def test_schedules_list_shows_a_class_of_entries_only(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = f"""
from mega import Schedule

class TenantReport(Schedule):
    cron = None
    timezone = "UTC"
    lock = {{"lock": "main", "ttl": 20_000, "key": {prefix!r}}}

    async def run(self, ctx): ...

schedules = [TenantReport]
"""
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    await run_schedules_command(
        config, "add", name="TenantReport", by="ada", key="acme", cron_expr="0 6 * * *"
    )
    assert capsys.readouterr().out.startswith(
        "TenantReport acme: added by ada, '0 6 * * *' in UTC, next "
    )
    await run_schedules_command(config, "list", name=None, by=None)
    own, acme = capsys.readouterr().out.splitlines()
    assert own == "TenantReport: no cron of its own (cron = None: its entries only), not paused"
    assert acme.startswith("  acme: '0 6 * * *' in UTC, next ") and acme.endswith(", by ada")
    await run_schedules_command(config, "list", name=None, by=None, as_json=True)
    line = json.loads(capsys.readouterr().out)
    assert (line["cron"], line["next_run"], [e["key"] for e in line["entries"]]) == (
        None,
        None,
        ["acme"],
    )
