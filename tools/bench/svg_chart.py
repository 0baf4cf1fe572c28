"""A small log-log line chart written as SVG text (no plotting dependency).

:func:`log_log_chart` draws one or more panels side by side; each panel has a title, a y-axis
label and named series of ``(x, y)`` points, both axes on a base-10 log scale. The benchmarks use
it to put their figures in the docs without matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

__all__ = ["Panel", "log_log_chart"]

#: Series colours, in order (colour-blind-safe Okabe-Ito hues).
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
WIDTH, HEIGHT = 420, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 36, 48


@dataclass(frozen=True)
class Panel:
    """One chart panel.

    Attributes:
        title: shown above the panel.
        y_label: the y axis' label (its unit).
        series: name -> points ``(x, y)``, every x and y > 0.
        x_label: the x axis' label.
    """

    title: str
    y_label: str
    series: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)
    x_label: str = "nodes (N)"


def _decades(low: float, high: float) -> tuple[int, int]:
    lo, hi = math.floor(math.log10(low)), math.ceil(math.log10(high))
    return lo, max(hi, lo + 1)


def _label(value: float) -> str:
    if value >= 1:
        return f"{value:g}"
    return f"{value:.0e}".replace("e-0", "e-")


def _panel(panel: Panel, x0: float) -> list[str]:
    points = [p for pts in panel.series.values() for p in pts]
    if not points:
        raise ValueError(f"chart panel {panel.title!r} has no points")
    if any(x <= 0 or y <= 0 for x, y in points):
        raise ValueError(f"chart panel {panel.title!r}: a log scale needs x > 0 and y > 0, got {points}")
    xlo, xhi = _decades(min(x for x, _ in points), max(x for x, _ in points))
    ylo, yhi = _decades(min(y for _, y in points), max(y for _, y in points))
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return x0 + LEFT + (math.log10(x) - xlo) / (xhi - xlo) * pw

    def sy(y: float) -> float:
        return TOP + ph - (math.log10(y) - ylo) / (yhi - ylo) * ph

    out = [
        f'<text x="{x0 + WIDTH / 2:.1f}" y="20" text-anchor="middle" font-weight="bold">{escape(panel.title)}</text>',
        f'<rect x="{x0 + LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>',
    ]
    for d in range(xlo, xhi + 1):
        x = sx(10.0**d)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle">{_label(10.0**d)}</text>')
    for d in range(ylo, yhi + 1):
        y = sy(10.0**d)
        out.append(f'<line x1="{x0 + LEFT}" y1="{y:.1f}" x2="{x0 + LEFT + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(10.0**d)}</text>')
    out.append(
        f'<text x="{x0 + LEFT + pw / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle">{escape(panel.x_label)}</text>'
    )
    cy = TOP + ph / 2
    out.append(
        f'<text x="{x0 + 14}" y="{cy:.1f}" text-anchor="middle" transform="rotate(-90 {x0 + 14} {cy:.1f})">'
        f"{escape(panel.y_label)}</text>"
    )
    for i, (name, pts) in enumerate(panel.series.items()):
        colour = COLOURS[i % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 14 + 14 * i
        out.append(f'<rect x="{x0 + LEFT + 8}" y="{ly - 8}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x0 + LEFT + 22}" y="{ly + 1}">{escape(name)}</text>')
    return out


def log_log_chart(panels: Sequence[Panel], *, caption: str = "") -> str:
    """The SVG text of ``panels`` side by side, each a log-log line chart, with ``caption`` below.

    Raises:
        ValueError: a panel has no points, or a point that a log scale cannot show (<= 0).
    """
    if not panels:
        raise ValueError("a chart needs at least one panel")
    width = WIDTH * len(panels)
    height = HEIGHT + (20 if caption else 0)
    body: list[str] = []
    for i, panel in enumerate(panels):
        body.extend(_panel(panel, i * WIDTH))
    if caption:
        body.append(f'<text x="8" y="{HEIGHT + 12}" font-size="11" fill="#555">{escape(caption)}</text>')
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">'
    )
    return "\n".join([head, f'<rect width="{width}" height="{height}" fill="white"/>', *body, "</svg>"]) + "\n"
