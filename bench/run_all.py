"""Run every benchmark in bench/ in one go and rewrite bench/RESULTS.md.

    .venv/bin/python -m bench.run_all        # what `make bench` runs
    .venv/bin/python -m bench.run_all bench.bench_hosts_memory   # these only (see refresh)

A benchmark is any module `bench/bench_*.py` with a `run()` function (sync, or async and then
run with asyncio.run); it is called with its defaults, one after the other so they never
compete for the cores. A benchmark that raises is reported as an error and the others still
run. RESULTS.md gets the machine, the date, the command and one section per benchmark with its
table (figure, value, baseline, ratio, target, result). Exit status 1 when a target is missed
or a benchmark failed.

Named benchmarks run alone, and only their sections and summary rows of RESULTS.md are
replaced, each saying when it was refreshed: how to refresh a figure that does not depend on
the machine's speed (memory, counts) without rerunning, on a busier machine, every rate.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run by path (python bench/x.py): make `app`, `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import Result, markdown_table
from mega.drivers.nats.embedded import find_nats_server

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "RESULTS.md"
COMMAND = "python -m bench.run_all"


@dataclass
class Outcome:
    """One benchmark's run: its result, or the error that ended it."""

    module: str
    seconds: float
    result: dict[str, Any] | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.get("passed", True) is not False


def discover(
    only: list[str] | None = None,
) -> Iterator[tuple[str, Callable[[], Any] | None, str | None]]:
    """(module, its run function or None, the import error or None), in file name order;
    `only`: those modules."""
    for path in sorted(BENCH_DIR.glob("bench_*.py")):
        name = f"bench.{path.stem}"
        if only is not None and name not in only:
            continue
        try:
            module = importlib.import_module(name)
        except Exception:
            yield name, None, traceback.format_exc()
            continue
        run = getattr(module, "run", None)
        if callable(run):
            yield name, run, None


def run_one(name: str, run: Callable[[], Any]) -> Outcome:
    print(f"\n=== {name} ===", flush=True)
    started = time.monotonic()
    try:
        value = run()
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        if not isinstance(value, dict):
            raise TypeError(f"{name}.run() returned {type(value).__name__}, not a dict")
        return Outcome(name, time.monotonic() - started, result=value)
    except Exception:
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
        return Outcome(name, time.monotonic() - started, error=error)


async def _awaited(value: Any) -> Any:
    return await value


def machine() -> dict[str, str]:
    """nproc, CPU model, OS, Python and nats-server versions."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nats = (
            subprocess.run(
                [find_nats_server(), "--version"], capture_output=True, text=True, timeout=10
            )
            .stdout.strip()
            .removeprefix("nats-server: ")
        )
    except Exception as exc:
        nats = f"unknown ({exc})"
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "CPU": model,
        "OS": platform.platform(),
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "nats-server": nats,
    }


def render(outcomes: list[Outcome], info: dict[str, str], started: datetime, total_s: float) -> str:
    lines = [
        "# Benchmark results",
        "",
        f"Written by `{COMMAND}` (`make bench`); rerun it to refresh. "
        "Targets: each table's target column, set in its benchmark module.",
        "",
        "| | |",
        "| --- | --- |",
        f"| date | {started:%Y-%m-%d %H:%M} UTC |",
        f"| command | `{' '.join([COMMAND, *sys.argv[1:]])}` |",
        *(f"| {key} | {value} |" for key, value in info.items()),
        f"| total time | {total_s:.0f} s |",
        "",
        "| benchmark | result | time |",
        "| --- | --- | --- |",
    ]
    lines += [verdict_row(outcome) for outcome in outcomes]
    for outcome in outcomes:
        lines += ["", *section(outcome)]
    return "\n".join(lines) + "\n"


def section(outcome: Outcome) -> list[str]:
    path = f"bench/{outcome.module.removeprefix('bench.')}.py"
    res = outcome.result
    if res is None:
        last = (outcome.error or "").strip().splitlines()[-1:] or ["no detail"]
        return [f"## `{path}`", "", f"ERROR: `{last[0]}` (full trace on stderr)"]
    lines = [f"## {res.get('title', outcome.module)} (`{path}`)", ""]
    if res.get("setup"):
        lines += [str(res["setup"]), ""]
    try:
        lines.append(markdown_table(cast(Result, res)))
    except (KeyError, TypeError):  # not a bench.report Result: its figures as they are
        lines += ["| key | value |", "| --- | --- |"]
        lines += [f"| {key} | {json.dumps(value, default=str)} |" for key, value in res.items()]
    notes = res.get("notes")
    lines += ["", *(f"- {note}" for note in notes)] if isinstance(notes, list) and notes else []
    return lines


def kept_scale_curves() -> str:
    """The scale curves' part of RESULTS.md (`make bench-scale` writes it), kept as it is."""
    current = RESULTS.read_text() if RESULTS.exists() else ""
    begin = current.find("<!-- scale curves:")
    return "\n" + current[begin:] if begin >= 0 else ""


def verdict(outcome: Outcome) -> str:
    return "ERROR" if outcome.error else "pass" if outcome.passed else "FAIL"


def verdict_row(outcome: Outcome) -> str:
    return f"| `{outcome.module}` | {verdict(outcome)} | {outcome.seconds:.0f} s |"


def refresh(current: str, outcomes: list[Outcome], started: datetime) -> str:
    """RESULTS.md with these benchmarks' summary rows and sections replaced (each section then
    says when it was refreshed, and by which command); the rest as it was."""
    lines = current.rstrip("\n").split("\n")
    for outcome in outcomes:
        row_start = f"| `{outcome.module}` |"
        lines = [verdict_row(outcome) if line.startswith(row_start) else line for line in lines]
        marker = f"(`bench/{outcome.module.removeprefix('bench.')}.py`)"
        fresh = section(outcome)
        fresh[2:2] = [
            f"Refreshed alone on {started:%Y-%m-%d %H:%M} UTC "
            f"(`{COMMAND} {outcome.module}`); the other sections are from the run above.",
            "",
        ]
        begin = next(
            (n for n, line in enumerate(lines) if line.startswith("## ") and marker in line), None
        )
        if begin is None:
            raise SystemExit(f"{RESULTS.name} has no section for {outcome.module}: run them all")
        end = next(
            (
                n
                for n in range(begin + 1, len(lines))
                if lines[n].startswith(("## ", "<!-- scale curves:"))
            ),
            len(lines),
        )
        blank = [""] if end < len(lines) else []
        lines[begin:end] = fresh + blank
    return "\n".join(lines) + "\n"


def main() -> int:
    started = datetime.now(UTC)
    clock = time.monotonic()
    info = machine()
    only = sys.argv[1:] or None
    outcomes = []
    for name, run, import_error in discover(only):
        if run is None:
            print(f"\n=== {name} ===\n{import_error}", file=sys.stderr, flush=True)
            outcomes.append(Outcome(name, 0.0, error=import_error))
        else:
            outcomes.append(run_one(name, run))
    if only is not None:
        unknown = sorted(set(only) - {outcome.module for outcome in outcomes})
        if unknown:
            print(f"no benchmark {', '.join(unknown)} (a module bench.bench_*)", file=sys.stderr)
            return 2
        RESULTS.write_text(refresh(RESULTS.read_text(), outcomes, started))
    else:
        RESULTS.write_text(
            render(outcomes, info, started, time.monotonic() - clock) + kept_scale_curves()
        )
    print(f"\nwrote {RESULTS}")
    for outcome in outcomes:
        print(f"  {verdict(outcome):<5} {outcome.module} ({outcome.seconds:.0f} s)")
    return 0 if all(outcome.passed for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
