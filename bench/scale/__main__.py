"""Run the scale curves and write their part of bench/RESULTS.md (see bench/scale/__init__.py).

.venv/bin/python -m bench.scale [NAME ...]    # every curve, or the ones named
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.bench_dlq import embedded_servers
from bench.report import markdown_table, print_table
from bench.run_all import RESULTS, machine
from bench.svg import write_chart

SCALE_DIR = Path(__file__).resolve().parent
BEGIN = "<!-- scale curves: written by `make bench-scale` -->"
END = "<!-- end of the scale curves -->"


def curves(names: list[str]) -> list[str]:
    found = sorted(p.stem.removeprefix("curve_") for p in SCALE_DIR.glob("curve_*.py"))
    unknown = set(names) - set(found)
    if unknown:
        raise SystemExit(f"bench.scale: no curve {sorted(unknown)}; there are {found}")
    return names or found


def memory_text() -> str:
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return f"{pages * size / 2**30:.1f} GiB"


def section(
    results: list[dict[str, Any]], info: dict[str, str], started: datetime, total_s: float
) -> str:
    lines = [
        BEGIN,
        "# Scale curves",
        "",
        "Written by `python -m bench.scale` (`make bench-scale`); each curve's points measured "
        "in one run (a curve run on its own, `python -m bench.scale NAME`, replaces its part).",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, {info['nproc']} cores ({info['CPU']}), "
        f"{memory_text()} of memory, {info['OS']}, {info['Python']}, nats-server "
        f"{info['nats-server']}; {total_s / 60:.0f} minutes in all.",
    ]
    ran = {res["name"]: curve_text(res) for res in results}
    for name in curves([]):  # every curve, in order: a curve not run this time keeps its text
        text = ran.get(name) or kept_curve(name)
        if text:
            lines += ["", text]
    lines.append(END)
    return "\n".join(lines) + "\n"


def curve_text(res: dict[str, Any]) -> str:
    """One curve's part, between markers that a later run of other curves keeps."""
    lines = [f"<!-- curve {res['name']} -->"]
    lines += [f"## {res['title']} (`bench/scale/curve_{res['name']}.py`)", ""]
    if "error" in res:
        lines.append(f"ERROR: `{res['error']}` (full trace on stderr)")
    else:
        lines += [res["setup"], ""]
        lines += [f"![{chart['title']}](scale/{chart['name']}.svg)" for chart in res["charts"]]
        lines += ["", markdown_table(res)]  # type: ignore[arg-type]
        lines += ["", *(f"- {note}" for note in res["notes"])] if res["notes"] else []
    lines.append(f"<!-- end of curve {res['name']} -->")
    return "\n".join(lines)


def kept_curve(name: str) -> str:
    """A curve's part as RESULTS.md has it from an earlier run ("" when it has none)."""
    current = RESULTS.read_text() if RESULTS.exists() else ""
    begin, end = f"<!-- curve {name} -->", f"<!-- end of curve {name} -->"
    if begin not in current or end not in current:
        return ""
    return begin + current.split(begin, 1)[1].split(end, 1)[0] + end


def write_section(text: str) -> None:
    """Replace the scale part of RESULTS.md (or add it at the end)."""
    current = RESULTS.read_text() if RESULTS.exists() else ""
    if BEGIN in current and END in current:
        head, rest = current.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        RESULTS.write_text(head + text + tail)
    else:
        RESULTS.write_text(current.rstrip("\n") + "\n\n" + text)


def run_curve(name: str, urls: dict[str, str]) -> dict[str, Any]:
    print(f"\n=== curve {name} ===", flush=True)
    started = time.monotonic()
    try:
        module = importlib.import_module(f"bench.scale.curve_{name}")
        res: dict[str, Any] = dict(asyncio.run(module.run(urls)))
    except Exception:
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
        return {
            "name": name,
            "title": name,
            "error": error.strip().splitlines()[-1],
            "passed": False,
        }
    for chart in res["charts"]:
        write_chart(
            SCALE_DIR / f"{chart['name']}.svg", **{k: v for k, v in chart.items() if k != "name"}
        )
    print_table(res)  # type: ignore[arg-type]
    print(f"({time.monotonic() - started:.0f} s)")
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="curves to run (default: every one)")
    names = curves(parser.parse_args().names)
    started, clock = datetime.now(UTC), time.monotonic()
    results = []
    for name in names:
        # Fresh servers for each curve: none pays for what an earlier one left behind (run
        # after the others on shared servers, the schedules curve read a p99 of 92 ms at
        # 1,000 schedules; on its own, 15 ms).
        with (
            tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp,
            embedded_servers(Path(tmp)) as urls,
        ):
            results.append(run_curve(name, urls))
    write_section(section(results, machine(), started, time.monotonic() - clock))
    print(f"\nwrote the scale curves into {RESULTS}")
    return 0 if all(res.get("passed") for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
