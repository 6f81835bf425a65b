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

from mega.config import Config, load_config
from mega.errors import ConfigError, DependencyUnavailable, MegaError
from mega.runtime.cli_parser import build_parser
from mega.runtime.logs import setup_logging
from mega.runtime.scaffold import new_project
from mega.runtime.telemetry import setup_tracing

EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 3
# The reader of the output left (`mega jobs stats | head -1`): what a tool killed by SIGPIPE
# ends with (128 + 13).
EXIT_READER_LEFT = 141


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
    from mega.runtime.web_host import run_web

    return run_web(config, args.host, args.port)


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


def _db(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.db_cli import run_db_command

    return run_db_command(config, args.action)


def _token(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.db_cli import run_token_command

    return run_token_command(
        config, args.action, name=args.name, scope=args.scope, expires=args.expires
    )


def _audit(config: Config, args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    from mega.runtime.db_cli import run_audit_command

    return run_audit_command(config, target=args.target, job_id=args.id, limit=args.limit)


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
