"""Scale curves: how each cost grows with the work, for every bus driver where it applies.

    make bench-scale                          # every curve; ~20 minutes on 2 cores
    .venv/bin/python -m bench.scale dlq       # one curve (its module's name after curve_)

A curve is a module `bench/scale/curve_<name>.py` with `run(servers)`, `servers` the URLs of
the embedded servers the run started once for all curves (nats, redis, postgres). It returns a
bench.report Result with a `charts` list: each chart's series of (x, y) points, drawn to
`bench/scale/<chart>.svg` by bench/svg.py, and the table rows that hold each point to its
target. The runner writes the "Scale curves" part of bench/RESULTS.md (which `make bench` keeps
as it is), with the machine's cores and memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bench.report import Result, Row, number, result, row

Points = Sequence[tuple[int, float]]


def last_against_first(
    figure: str,
    points: Points,
    target: float,
    *,
    most: bool = False,
    show: Callable[[float], str] = number,
) -> Row:
    """The curve's last point against its first, held to at least (`most`: at most) `target`
    times it."""
    (first_x, first), (_, last) = points[0], points[-1]
    passed = last <= target * first if most else last >= target * first
    return row(
        figure,
        last,
        show=show,
        baseline=first,
        baseline_name=f"at {first_x:,}",
        target=f"{'<=' if most else '>='} {target:g}x",
        passed=passed,
    )


def curve(
    name: str,
    title: str,
    setup: str,
    rows: list[Row],
    charts: list[dict[str, Any]],
    data: Any,
    notes: Sequence[str] = (),
) -> Result:
    """A curve's result: bench.report's, with the charts the runner draws (see the module)."""
    res = result(name, title, setup, rows, notes=notes)
    return {**res, "charts": charts, "data": data}  # type: ignore[typeddict-unknown-key]
