"""A line chart as a standalone SVG file, drawn by the benchmarks themselves (no plotting
library): a few series of (x, y) points, the x axis logarithmic (the scale curves' points are
powers of ten apart) or linear, the y axis linear from 0, a legend, and a dashed target line.

    write_chart(path, title="DLQ first page", x_label="dead letters", y_label="ms",
                series={"nats": [(100, 0.8), (10_000, 0.9)]}, target=200)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 640, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 40, 48  # the plot's margins (the legend sits on the right)
# One colour per series, distinct in light and dark viewers and for the common colour blindness.
COLOURS = ("#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#475569")
TICKS = 5
LEGEND_CHARS = 16  # characters a legend line holds beside the plot (12 px text, 108 px)


def nice_max(value: float) -> float:
    """The round number at or above `value` the y axis ends at (1, 2 or 5 times a power of 10)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return float(next(step * power for step in (1, 2, 5, 10) if step * power >= value))


def label(value: float) -> str:
    if value >= 1_000_000 and value % 1_000_000 == 0:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000 and value % 1_000 == 0:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def legend_lines(name: str) -> list[str]:
    """A series' name in lines that fit the legend's column (whole words; a long word alone)."""
    lines: list[str] = []
    for word in name.split():
        if lines and len(lines[-1]) + 1 + len(word) <= LEGEND_CHARS:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def tag(name: str, text: str | None = None, **attrs: object) -> str:
    """One element: `tag("text", "hi", x=1, text_anchor="end")` (underscores become dashes)."""
    shown = " ".join(
        f'{key.rstrip("_").replace("_", "-")}="{value:.1f}"'
        if isinstance(value, float)
        else f'{key.rstrip("_").replace("_", "-")}="{value}"'
        for key, value in attrs.items()
    )
    return f"<{name} {shown}/>" if text is None else f"<{name} {shown}>{escape(text)}</{name}>"


def write_chart(
    path: Path,
    *,
    title: str,
    x_label: str,
    y_label: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    target: float | None = None,
    log_x: bool = True,
) -> None:
    """Draw the series to `path` (an .svg file)."""
    xs = sorted({x for points in series.values() for x, _ in points})
    ys = [y for points in series.values() for _, y in points if math.isfinite(y)]
    top = nice_max(max([*ys, target or 0, 0]) * 1.05)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    ink, grey = "#111827", "#4b5563"

    def px(x: float) -> float:
        if len(xs) == 1:
            return LEFT + plot_w / 2
        lo, hi = (math.log10(xs[0]), math.log10(xs[-1])) if log_x else (xs[0], xs[-1])
        return LEFT + ((math.log10(x) if log_x else x) - lo) / (hi - lo) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - y / top * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        tag("rect", width=WIDTH, height=HEIGHT, fill="#ffffff"),
        tag("text", title, x=LEFT, y=22, font_size=14, font_weight=600, fill=ink),
    ]
    for n in range(TICKS + 1):
        value, y = top * n / TICKS, py(top * n / TICKS)
        parts.append(tag("line", x1=LEFT, x2=LEFT + plot_w, y1=y, y2=y, stroke="#e5e7eb"))
        parts.append(
            tag("text", label(round(value, 6)), x=LEFT - 6, y=y + 4, text_anchor="end", fill=grey)
        )
    for x in xs:
        parts.append(
            tag("text", label(x), x=px(x), y=TOP + plot_h + 16, text_anchor="middle", fill=grey)
        )
    axis = x_label + (" (log scale)" if log_x else "")
    parts.append(
        tag("text", axis, x=LEFT + plot_w / 2, y=HEIGHT - 8, text_anchor="middle", fill=ink)
    )
    middle = TOP + plot_h / 2
    parts.append(
        tag(
            "text",
            y_label,
            x=14,
            y=middle,
            text_anchor="middle",
            fill=ink,
            transform=f"rotate(-90 14 {middle:.1f})",
        )
    )
    if target is not None:
        y = py(target)
        parts.append(
            tag(
                "line",
                x1=LEFT,
                x2=LEFT + plot_w,
                y1=y,
                y2=y,
                stroke="#dc2626",
                stroke_dasharray="6 4",
            )
        )
        parts.append(
            tag(
                "text",
                f"target {label(target)}",
                x=LEFT + plot_w - 4,
                y=y - 5,
                text_anchor="end",
                fill="#dc2626",
            )
        )
    ly = TOP + 10
    for n, (name, points) in enumerate(series.items()):
        colour = COLOURS[n % len(COLOURS)]
        shown = [(x, y) for x, y in sorted(points) if math.isfinite(y)]
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in shown)
        parts.append(tag("polyline", points=line, fill="none", stroke=colour, stroke_width=2))
        parts += [tag("circle", cx=px(x), cy=py(y), r=3.5, fill=colour) for x, y in shown]
        parts.append(
            tag(
                "line",
                x1=WIDTH - RIGHT + 16,
                x2=WIDTH - RIGHT + 36,
                y1=ly,
                y2=ly,
                stroke=colour,
                stroke_width=2,
            )
        )
        for row, words in enumerate(legend_lines(name)):
            parts.append(tag("text", words, x=WIDTH - RIGHT + 42, y=ly + 4 + row * 15, fill=ink))
        ly += 20 + 15 * (len(legend_lines(name)) - 1)
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")
