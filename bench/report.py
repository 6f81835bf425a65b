"""The shape every benchmark returns, percentiles, and its table as text or Markdown.

A benchmark's `run()` returns a `Result`: a few `Row`s, each one figure measured against a
baseline timed in the same run, with the target it is held to (or none: context only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

COLUMNS = ("figure", "value", "baseline", "ratio", "target", "result")


class Row(TypedDict):
    figure: str  # what was measured, with its unit
    value: str
    baseline: str  # "" when the figure has no baseline
    ratio: str  # value / baseline, "" without a baseline
    target: str  # the target it is held to, "" when the row is context only
    passed: bool | None  # None: no target


class Result(TypedDict):
    name: str  # module name without the bench_ prefix
    title: str
    setup: str  # what ran, with which parameters
    rows: list[Row]
    passed: bool  # every row with a target met it
    notes: list[str]
    data: dict[str, Any]  # the raw numbers, for anyone who wants more than the table


def number(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def ms(value: float) -> str:
    return f"{value:,.1f} ms"


def row(
    figure: str,
    value: float,
    *,
    show: Callable[[float], str] = number,
    baseline: float | None = None,
    baseline_name: str = "",
    target: str = "",
    passed: bool | None = None,
) -> Row:
    """One table row; the ratio is value / baseline when a (non-zero) baseline is given."""
    baseline_text = ratio = ""
    if baseline is not None:
        baseline_text = show(baseline) + (f" ({baseline_name})" if baseline_name else "")
        ratio = f"{value / baseline:.2f}x" if baseline else "n/a"
    return Row(
        figure=figure,
        value=show(value),
        baseline=baseline_text,
        ratio=ratio,
        target=target,
        passed=passed,
    )


def result(
    name: str,
    title: str,
    setup: str,
    rows: list[Row],
    *,
    notes: Sequence[str] = (),
    data: dict[str, Any] | None = None,
) -> Result:
    passed = all(r["passed"] is not False for r in rows)
    return Result(
        name=name,
        title=title,
        setup=setup,
        rows=rows,
        passed=passed,
        notes=list(notes),
        data=data or {},
    )


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, `q` in 0..100 (p99 of fewer than 100 samples is the max)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(samples: Sequence[float]) -> dict[str, float]:
    """`n`, `p50`, `p99` and `max` of a list of samples."""
    return {
        "n": len(samples),
        "p50": percentile(samples, 50),
        "p99": percentile(samples, 99),
        "max": max(samples) if samples else math.nan,
    }


def verdict(passed: bool | None) -> str:
    return {True: "pass", False: "FAIL", None: ""}[passed]


def cells(r: Row) -> list[str]:
    return [r["figure"], r["value"], r["baseline"], r["ratio"], r["target"], verdict(r["passed"])]


def print_table(res: Result) -> None:
    """The result as a plain-text table on stdout."""
    lines = [list(COLUMNS), *(cells(r) for r in res["rows"])]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    print(f"\n{res['title']}\n{res['setup']}")
    for i, line in enumerate(lines):
        padded = (text.ljust(width) for text, width in zip(line, widths, strict=True))
        print("  ".join(padded).rstrip())
        if i == 0:
            print("  ".join("-" * width for width in widths))
    for note in res["notes"]:
        print(f"note: {note}")
    print(f"overall: {verdict(res['passed'])}")


def markdown_table(res: Result) -> str:
    """The rows as a Markdown table (no title)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in res["rows"]:
        lines.append("| " + " | ".join(cells(r)) + " |")
    return "\n".join(lines)
