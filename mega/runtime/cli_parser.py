"""The `mega` command's arguments: `build_parser()`, every command and action with its own
`--help` (mega/runtime/cli.py runs what they name). It imports argparse and nothing heavy, so
`mega --help` answers at once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from mega.config import default_config_path
from mega.runtime.scaffold import BUSES, DEFAULT_BUS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mega",
        description="Start a project (new), or run the mega hosts: web, scheduler, job worker, "
        "or all of them in dev.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    new = sub.add_parser(
        "new",
        help="Write a runnable project into ./NAME: a schedule, a job, an event and its "
        "listener, a CPU worker, a web app, its config and tests that pass at once.",
        description="Write a runnable project into ./NAME: a schedule, a job, an event and its "
        "listener, a CPU worker, a web app with a JSON route and a page, its config and tests "
        "that pass at once. Needs no config; refuses a folder that is not empty.",
    )
    new.add_argument("name", metavar="NAME", help="the folder and its Python package (shop)")
    new.add_argument(
        "--bus",
        choices=BUSES,
        default=DEFAULT_BUS,
        help="where its jobs and events go: nats (JetStream, the default), redis (Redis "
        "Streams) or postgres (the application's database)",
    )

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return _with_config(sub.add_parser(name, help=help, description=help))

    start = command("start", "Serve the web app (uvicorn) with the CPU worker pools.")
    start.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"), help="bind address")
    start.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")), help="port")

    command("scheduler", "Run every schedule in config.schedules (once per tick across a cluster).")
    worker = command(
        "worker",
        "Consume every job in config.jobs, run the listener groups of config.listeners, and "
        "relay the outbox when config.events declares events.",
    )

    work = command(
        "work",
        "One process for a small deployment: the job worker, the listener groups, the outbox "
        "relay and, with --with-scheduler, the schedules. SIGTERM stops them in that order.",
    )
    work.add_argument(
        "--with-scheduler",
        action="store_true",
        help="also run the schedules (or set work = {'scheduler': True} in the config)",
    )
    for host in (worker, work):
        host.add_argument(
            "--apply-limits",
            action="store_true",
            help="change a running consumer whose concurrency or ack wait differs from its "
            "class (without it the difference is reported and kept; or set apply_limits = True)",
        )

    dev = command(
        "dev",
        "Everything on a laptop: embedded NATS and Redis (unless NATS_URL/REDIS_URL are set), "
        "then start + scheduler + worker with prefixed logs. Ctrl-C stops all.",
    )
    dev.add_argument("--host", default="127.0.0.1", help="bind address of the web app")
    dev.add_argument(
        "--port", type=int, default=int(os.environ.get("PORT", "8000")), help="web port"
    )
    for role in ("schedulers", "workers"):
        dev.add_argument(
            f"--{role}",
            type=_host_count,
            default=2,
            metavar="N",
            help=f"how many {role} to run (0 to 8, default 2: the lock and the sharing show)",
        )

    command(
        "check",
        "Validate every schedule, job, worker, event and listener of the config, as the hosts "
        "would, without connecting to any server; print every problem at once. Exit 1 on an "
        "error; warnings (what would fail silently) are printed and exit 0.",
    )
    dlq = command("dlq", "Inspect and repair dead-lettered jobs.")
    dlq.add_argument("action", choices=["list", "requeue", "purge"], help="what to do")
    dlq.add_argument("--job", help="job class name (default: every job in the config)")
    dlq.add_argument("--id", help="requeue only this job id (`list` shows the ids)")
    dlq.add_argument(
        "--all",
        action="store_true",
        dest="replay_all",
        help="requeue every record (of --job, or of every job); without --id or --all a "
        "requeue is refused and says how many records it would replay",
    )
    dlq.add_argument("--limit", type=int, default=20, help="how many records `list` shows")
    dlq.add_argument("--json", action="store_true", help="`list`: one JSON object per record")
    _jobs_parser(sub)
    _schedules_parser(sub)
    db = command("db", "The framework's database schema (Alembic migrations shipped with mega).")
    db.add_argument(
        "action",
        choices=["upgrade", "current"],
        help="apply missing migrations, or show the revision",
    )
    token = command(
        "token",
        "API tokens for scripts and services: `Authorization: Bearer <token>` on the JSON "
        "routes, no CSRF token needed. Stored hashed; the token is shown once, at create.",
    )
    token.add_argument("action", choices=["create", "list", "revoke"], help="what to do")
    token.add_argument("name", nargs="?", help="the token's name (create, revoke)")
    token.add_argument(
        "--expires",
        default="90d",
        metavar="WHEN",
        help="create: how long it works, a number and m, h, d or w (default 90d), or never",
    )
    token.add_argument(
        "--scope",
        default="jobs:enqueue,console:read",
        metavar="SCOPES",
        help="create: what it may do, comma-separated: jobs:enqueue (the application's writes), "
        "console:read (every read), console:operate (retry, requeue, cancel, pause, resume, "
        "run now), console:admin (purge, delete); default jobs:enqueue,console:read",
    )
    audit = command(
        "audit",
        "Who did what from a console or the command line: retries, requeues, cancels, pauses, "
        "runs now, purges and deletes, newest first.",
    )
    audit.add_argument("action", choices=["list"], help="what to do")
    audit.add_argument("--target", help="only these: job:NAME, group:NAME or schedule:NAME")
    audit.add_argument("--id", help="only the actions that named this job or event id")
    audit.add_argument("--limit", type=int, default=50, help="how many to show (default 50)")
    return parser


def _with_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every command but `new` takes (each action of `jobs` and `schedules` too)."""
    parser.add_argument(
        "--config",
        default=str(default_config_path()),
        help="config file (default: $MEGA_CONFIG or ./mega_config.py)",
    )
    parser.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    return parser


def _actions(
    sub: Any, name: str, help: str, **defaults: Any
) -> Callable[[str, str], argparse.ArgumentParser]:
    """A command made of actions (`mega jobs stats`), each with its own `--help`; `defaults`
    are the options some actions lack, so every action's namespace has them all."""
    parent = sub.add_parser(name, help=help, description=help)
    parent.set_defaults(**defaults)
    actions = parent.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        return _with_config(actions.add_parser(name, help=help, description=help))

    return action


def _jobs_parser(sub: Any) -> None:
    action = _actions(
        sub,
        "jobs",
        "Watch and steer the jobs of the config while the fleet runs.",
        target=None,
        job=None,
        by=None,
        json=False,
    )
    stats = action("stats", "Per job of the config: pending, in flight, dead letters, paused.")
    inspect = action(
        "inspect",
        "A job's status record (state, attempts, times, worker, last error), found by its id "
        "in every job of the config, or in --job; or, given a workflow's id, its state and "
        "each step's.",
    )
    cancel = action(
        "cancel",
        "Cancel one job: queued, delayed or retrying, it never runs; running, its worker "
        "cancels it within a second; finished, nothing changes and the answer says so.",
    )
    retry = action("retry", "Requeue one dead letter by its id (its attempts start again).")
    pause = action(
        "pause",
        "Pause a job's queue for the whole fleet within a second: no worker starts one, the "
        "running ones finish, enqueueing goes on.",
    )
    resume = action("resume", "Resume a paused job's queue: within a second the workers start it.")
    for by_id in (inspect, cancel, retry):
        by_id.add_argument("target", metavar="ID", help="the job's id (what enqueue returned)")
    for with_job in (stats, inspect, cancel, retry):
        with_job.add_argument("--job", help="job class name (default: every job in the config)")
    for with_json in (stats, inspect):
        with_json.add_argument("--json", action="store_true", help="one JSON object per line")
    for change in (pause, resume):
        change.add_argument("target", metavar="JOB", help="job class name")
        change.add_argument("--by", metavar="WHO", help="who, for the record (default: $USER@host)")


def _schedules_parser(sub: Any) -> None:
    action = _actions(
        sub,
        "schedules",
        "See, pause and resume the schedules of the config, and add or remove their dynamic "
        "entries.",
        target=None,
        by=None,
        json=False,
        key=None,
        cron=None,
        timezone=None,
        args=None,
    )
    listing = action(
        "list", "Each schedule of the config: cron, zone, next instant, and whether it is paused."
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per schedule")
    pause = action(
        "pause",
        "Pause a schedule on every scheduler from its next tick: its planned ticks are skipped "
        "with the reason 'paused' (a manual tick still runs). It needs a lock.",
    )
    resume = action("resume", "Resume a paused schedule: every scheduler runs its next tick.")
    add = action(
        "add",
        "Run schedule NAME under KEY on a cron of its own, with arguments (self.key and "
        "self.args in its runs), besides its own cron: every scheduler follows within about a "
        "second, each tick once. An existing KEY is changed. It needs a lock.",
    )
    remove = action(
        "remove",
        "Remove the dynamic entry KEY of schedule NAME: every scheduler stops its ticks within "
        "about a second (a run already going finishes).",
    )
    for change in (pause, resume, add, remove):
        change.add_argument("target", metavar="NAME", help="schedule name")
    for entry in (add, remove):
        entry.add_argument(
            "--key",
            required=True,
            metavar="KEY",
            help="the entry's key: 1 to 128 letters, digits or . _ @ - (a tenant id, say)",
        )
    add.add_argument(
        "--cron",
        required=True,
        metavar="EXPR",
        help='its cron: 5 fields, or 6 with seconds first ("*/30 * * * * *")',
    )
    add.add_argument(
        "--timezone", metavar="ZONE", help="IANA name such as Europe/Berlin (default: the class's)"
    )
    add.add_argument(
        "--args", metavar="JSON", help="a JSON object, self.args in its runs (default: {})"
    )
    for change in (pause, resume, add, remove):
        change.add_argument(
            "--by", metavar="WHO", help="who, for the record and the audit (default: $USER@host)"
        )


def _host_count(text: str) -> int:
    """`--schedulers` / `--workers`: a whole number from 0 to 8, or argparse names the problem."""
    if not text.isdigit() or not 0 <= int(text) <= 8:
        raise argparse.ArgumentTypeError(f"a whole number from 0 to 8, got {text!r}")
    return int(text)
