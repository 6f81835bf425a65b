"""The `mega` command: new, start, scheduler, worker, work, dev, check, dlq, jobs, schedules, db,
token.

Every command but `new` takes `--config PATH` (or MEGA_CONFIG; default ./mega_config.py). Errors
a user can fix (bad config, unreachable NATS/Redis) print one line naming the problem and exit
non-zero; no traceback reaches the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import select
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn

from mega.config import Config, default_config_path, load_config
from mega.errors import ConfigError, DependencyUnavailable, MegaError
from mega.runtime.logs import setup_logging
from mega.runtime.scaffold import BUSES, DEFAULT_BUS, new_project
from mega.runtime.telemetry import setup_tracing

EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 3
# The reader of the output left (`mega jobs stats | head -1`): what a tool killed by SIGPIPE
# ends with (128 + 13).
EXIT_READER_LEFT = 141


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


# The commands that run a host: they trace what they do when OTEL_TRACES_EXPORTER asks.
HOST_COMMANDS = ("start", "scheduler", "worker", "work")
# The commands that serve or change the web side: they need the `web` extra installed.
WEB_COMMANDS = ("start", "dev", "token", "audit")
WEB_MODULES = ("fastapi", "uvicorn", "jinja2", "itsdangerous", "pwdlib")


def main(argv: Sequence[str] | None = None) -> None:
    try:
        _command(argv)
    finally:
        _flush_stdout()


def _command(argv: Sequence[str] | None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "new":  # no config to read and nothing to log: it only writes files
        sys.exit(_new(args.name, args.bus))
    setup_logging(json_logs=args.json_logs)
    try:
        if args.command in WEB_COMMANDS:
            _need_web(args.command)
        if args.command == "dev":
            from mega.runtime.dev import run_dev

            hosts = {"schedulers": args.schedulers, "workers": args.workers}
            sys.exit(run_dev(args.config, host=args.host, port=args.port, **hosts))
        if args.command == "check":
            sys.exit(_check(args.config))
        config = load_config(args.config, signs=args.command == "start")
        if args.command in HOST_COMMANDS:
            setup_tracing("web" if args.command == "start" else args.command)
        _run(_COMMANDS[args.command](config, args))
    except ConfigError as exc:
        _die(args.command, exc.message, EXIT_CONFIG)
    except DependencyUnavailable as exc:
        _die(args.command, exc.message, EXIT_UNAVAILABLE)
    except MegaError as exc:
        _die(args.command, exc.message, 1)
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # a bug, not a user error: one line here, the trace on demand
        if isinstance(exc, BrokenPipeError) and _stdout_reader_gone():
            _reader_left()
        if os.environ.get("MEGA_DEBUG"):
            raise
        _die(
            args.command,
            f"internal error: {type(exc).__name__}: {exc} (MEGA_DEBUG=1 shows the trace)",
            1,
        )


def _flush_stdout() -> None:
    """Write out what is buffered now, where a reader that left can still be told apart."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _reader_left()


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader closed it (another broken pipe, a
    server's socket, is an error to report)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), or no file behind stdout
        return False


def _reader_left() -> NoReturn:
    """End quietly, as a tool killed by SIGPIPE does: the reader of the output is gone (`mega
    jobs inspect ID | grep -q running`), which is no error of ours to report. What is still
    buffered goes nowhere, so Python does not complain of it at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(EXIT_READER_LEFT)


def _need_web(command: str) -> None:
    missing = [name for name in WEB_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"mega {command} needs the web side, which this install lacks ({', '.join(missing)}):"
            " pip install 'mega-py[web]'"
        )


def _run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def _die(command: str, message: str, code: int) -> NoReturn:
    print(f"mega {command}: error: {message}", file=sys.stderr)
    sys.exit(code)


def _new(name: str, bus: str) -> int:
    try:
        target = new_project(name, Path.cwd(), bus=bus)
    except ConfigError as exc:
        _die("new", exc.message, EXIT_CONFIG)
    except OSError as exc:
        _die("new", f"cannot write the project: {exc}", 1)
    print(f"mega new: wrote {name}/ ({bus} bus). Next:")
    print(f"  cd {target.name}")
    print("  make test    # its tests, in memory")
    print("  make run     # mega dev; then open http://localhost:8000, log in as admin / admin")
    return 0


def _check(path: str) -> int:
    """`mega check`: each finding on a line of its own, then a summary; 1 when any is an error.
    A config that does not load is one error too: its line lists every bad key."""
    from mega.runtime.check import Finding, check_config, summary

    try:
        config = load_config(path, signs=False)
    except ConfigError as exc:
        print(Finding("error", "config", exc.message))
        print("mega check: 1 error (the config must load before its classes are checked)")
        return 1
    findings = check_config(config)
    for finding in findings:
        print(finding)
    print(summary(config, findings))
    return 1 if any(finding.level == "error" for finding in findings) else 0


def _start(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.hosts import run_web

    return run_web(config, args.host, args.port)


def _host_count(text: str) -> int:
    """`--schedulers` / `--workers`: a whole number from 0 to 8, or argparse names the problem."""
    if not text.isdigit() or not 0 <= int(text) <= 8:
        raise argparse.ArgumentTypeError(f"a whole number from 0 to 8, got {text!r}")
    return int(text)


def _scheduler(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.hosts import run_scheduler

    return run_scheduler(config)


def _worker(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.hosts import run_worker

    return run_worker(config, apply_limits=args.apply_limits)


def _work(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.hosts import run_work

    return run_work(config, with_scheduler=args.with_scheduler, apply_limits=args.apply_limits)


def _dlq(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.dlq_cli import run_dlq_command

    return run_dlq_command(
        config,
        args.action,
        job=args.job,
        job_id=args.id,
        limit=args.limit,
        replay_all=args.replay_all,
        as_json=args.json,
    )


def _jobs(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.jobs_cli import run_jobs_command

    return run_jobs_command(
        config, args.action, target=args.target, job=args.job, by=args.by, as_json=args.json
    )


def _schedules(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.schedules_cli import run_schedules_command

    return run_schedules_command(
        config,
        args.action,
        name=args.target,
        by=args.by,
        as_json=args.json,
        key=args.key,
        cron_expr=args.cron,
        timezone=args.timezone,
        args=args.args,
    )


async def _db(config: Config, args: argparse.Namespace) -> None:
    from mega.runtime.bootstrap import open_database
    from mega.runtime.migrate import current, head, upgrade

    db = await open_database(config.database_url, migrate=False)
    try:
        if args.action == "upgrade":
            before, after = await asyncio.to_thread(upgrade, db)
            change = "already at" if before == after else f"upgraded from {before or 'empty'} to"
            print(f"database {db.redacted_url}: {change} {after}")
        else:
            now = await asyncio.to_thread(current, db)
            print(f"database {db.redacted_url}: at {now or 'nothing (empty)'}; newest {head()}")
    finally:
        db.dispose()


async def _token(config: Config, args: argparse.Namespace) -> None:
    from mega.runtime.bootstrap import open_database
    from mega.web import tokens

    if args.action != "list" and not args.name:
        raise ConfigError(f"mega token {args.action} needs a NAME: mega token {args.action} NAME")
    db = await open_database(config.database_url, migrate=True)
    try:
        if args.action == "create":
            scopes = tokens.parse_scopes(args.scope)
            expires_in = tokens.parse_expires(args.expires)
            secret = await db.run(
                lambda s: tokens.create_token(s, args.name, scopes=scopes, expires_in=expires_in)
            )
            print(secret)
            ends = "never expires" if expires_in is None else f"expires in {args.expires}"
            print(
                f"token {args.name!r} created ({ends}; scopes {','.join(scopes)}): it is "
                "shown this once, keep it somewhere safe",
                file=sys.stderr,
            )
        elif args.action == "revoke":
            if not await db.run(lambda session: tokens.revoke_token(session, args.name)):
                raise MegaError(f"no token named {args.name!r} (mega token list shows them)")
            print(f"token {args.name!r} revoked")
        else:
            rows = await db.run(tokens.list_tokens)
            for row in rows:
                print(row.describe())
            if not rows:
                print("no API tokens yet: mega token create NAME")
    except tokens.TokenError as exc:
        raise MegaError(str(exc)) from exc
    finally:
        db.dispose()


async def _audit(config: Config, args: argparse.Namespace) -> None:
    from mega import audit
    from mega.runtime.bootstrap import open_database

    db = await open_database(config.database_url, migrate=True)
    try:
        rows = await db.run(
            lambda s: audit.entries(s, target=args.target, job_id=args.id, limit=args.limit)
        )
    finally:
        db.dispose()
    for row in rows:
        print(row.describe())
    if not rows:
        print("no console actions recorded" + (" of these" if args.target or args.id else ""))


_COMMANDS: dict[str, Callable[[Config, argparse.Namespace], Coroutine[Any, Any, None]]] = {
    "start": _start,
    "scheduler": _scheduler,
    "worker": _worker,
    "work": _work,
    "dlq": _dlq,
    "jobs": _jobs,
    "schedules": _schedules,
    "db": _db,
    "token": _token,
    "audit": _audit,
}


if __name__ == "__main__":
    main()
