"""Small charts written as SVG text (no plotting dependency): log-log lines and grouped bars.

:func:`log_log_chart` draws one or more panels side by side; each panel has a title, a y-axis
label and named series of ``(x, y)`` points, both axes on a base-10 log scale. :func:`bar_chart`
draws panels of horizontal bars, one group per row (e.g. rallypoint and torch per measure), on a
linear scale from zero. The benchmarks use them to put their figures in the docs without
matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

__all__ = ["BarPanel", "Panel", "bar_chart", "log_log_chart"]

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
        legend: where the series' names go, ``"top-left"`` or ``"bottom-right"`` (away from the data).
    """

    title: str
    y_label: str
    series: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)
    x_label: str = "nodes (N)"
    legend: str = "top-left"


def _decades(low: float, high: float) -> tuple[int, int]:
    lo, hi = math.floor(math.log10(low)), math.ceil(math.log10(high))
    return lo, max(hi, lo + 1)


def _label(value: float) -> str:
    if value >= 1e5:
        return f"1e{round(math.log10(value))}"
    if value >= 1:
        return f"{value:g}"
    return f"{value:.0e}".replace("e-0", "e-")


def _panel(panel: Panel, x0: float) -> list[str]:
    points = [p for pts in panel.series.values() for p in pts]
    if not points:
        raise ValueError(f"chart panel {panel.title!r} has no points")
    if any(x <= 0 or y <= 0 for x, y in points):
        raise ValueError(f"chart panel {panel.title!r}: a log scale needs x > 0 and y > 0, got {points}")
    if panel.legend not in ("top-left", "bottom-right"):
        raise ValueError(f"chart panel {panel.title!r}: legend {panel.legend!r} is not top-left or bottom-right")
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
        if panel.legend == "top-left":
            lx, ly = x0 + LEFT + 8, TOP + 14 + 14 * i
        else:
            lx, ly = x0 + WIDTH - RIGHT - 190, TOP + ph - 8 - 14 * (len(panel.series) - 1 - i)
        out.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly + 1}">{escape(name)}</text>')
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


@dataclass(frozen=True)
class BarPanel:
    """One panel of horizontal bars.

    Attributes:
        title: shown above the panel.
        x_label: the value axis' label (its unit).
        rows: row label -> series name -> value (>= 0); every row draws one bar per series, in
            the order of the series' first appearance.
    """

    title: str
    x_label: str
    rows: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


BAR, BAR_GAP, ROW_GAP, BAR_LEFT = 12, 2, 14, 150


def _nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= ``value``."""
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # pragma: no cover (the loop's last step always fits)


def _bar_panel(panel: BarPanel, x0: float, series: Sequence[str], height: float) -> list[str]:
    values = [v for row in panel.rows.values() for v in row.values()]
    if not values:
        raise ValueError(f"bar panel {panel.title!r} has no values")
    if any(v < 0 or math.isnan(v) for v in values):
        raise ValueError(f"bar panel {panel.title!r}: bars need values >= 0, got {values}")
    top = _nice_max(max(values)) if max(values) > 0 else 1.0
    pw = WIDTH - BAR_LEFT - RIGHT
    bottom = height - BOTTOM

    def sx(v: float) -> float:
        return x0 + BAR_LEFT + v / top * pw

    out = [
        f'<text x="{x0 + WIDTH / 2:.1f}" y="20" text-anchor="middle" font-weight="bold">{escape(panel.title)}</text>',
        f'<rect x="{x0 + BAR_LEFT}" y="{TOP}" width="{pw}" height="{bottom - TOP}" fill="none" stroke="#888"/>',
    ]
    for i in range(5):
        v = top * i / 4
        out.append(f'<line x1="{sx(v):.1f}" y1="{TOP}" x2="{sx(v):.1f}" y2="{bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{sx(v):.1f}" y="{bottom + 16}" text-anchor="middle">{v:g}</text>')
    out.append(
        f'<text x="{x0 + BAR_LEFT + pw / 2:.1f}" y="{height - 10}" text-anchor="middle">{escape(panel.x_label)}</text>'
    )
    y = TOP + ROW_GAP / 2
    for label, row in panel.rows.items():
        drawn = [name for name in series if name in row]
        group = len(drawn) * (BAR + BAR_GAP)
        out.append(
            f'<text x="{x0 + BAR_LEFT - 6}" y="{y + group / 2 + 4:.1f}" text-anchor="end">{escape(label)}</text>'
        )
        for name in drawn:
            colour = COLOURS[series.index(name) % len(COLOURS)]
            width = sx(row[name]) - (x0 + BAR_LEFT)
            out.append(f'<rect x="{x0 + BAR_LEFT}" y="{y:.1f}" width="{width:.1f}" height="{BAR}" fill="{colour}"/>')
            out.append(
                f'<text x="{x0 + BAR_LEFT + width + 4:.1f}" y="{y + BAR - 2:.1f}" font-size="10">{row[name]:g}</text>'
            )
            y += BAR + BAR_GAP
        y += ROW_GAP
    return out


def bar_chart(panels: Sequence[BarPanel], *, caption: str = "") -> str:
    """The SVG text of ``panels`` side by side, each of horizontal bars, with a legend and ``caption``.

    Raises:
        ValueError: no panel, a panel without values, or a negative value.
    """
    if not panels:
        raise ValueError("a chart needs at least one panel")
    series: list[str] = []
    for panel in panels:
        for row in panel.rows.values():
            series.extend(name for name in row if name not in series)
    most = max(
        (sum(len(row) for row in p.rows.values()) * (BAR + BAR_GAP) + len(p.rows) * ROW_GAP for p in panels),
        default=0,
    )
    plot = max(most, 60)
    height = TOP + plot + BOTTOM
    width = WIDTH * len(panels)
    total = height + 20 + (20 if caption else 0)
    body: list[str] = []
    for i, panel in enumerate(panels):
        body.extend(_bar_panel(panel, i * WIDTH, series, height))
    for i, name in enumerate(series):
        lx = 8 + 160 * i
        body.append(f'<rect x="{lx}" y="{height + 2}" width="10" height="10" fill="{COLOURS[i % len(COLOURS)]}"/>')
        body.append(f'<text x="{lx + 14}" y="{height + 11}">{escape(name)}</text>')
    if caption:
        body.append(f'<text x="8" y="{height + 32}" font-size="11" fill="#555">{escape(caption)}</text>')
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total}" '
        f'viewBox="0 0 {width} {total}" font-family="sans-serif" font-size="12">'
    )
    return "\n".join([head, f'<rect width="{width}" height="{total}" fill="white"/>', *body, "</svg>"]) + "\n"
