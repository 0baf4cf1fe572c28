"""tools/bench/svg_chart.py: a log-log chart as SVG text, points placed by their logarithms."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tools.bench.svg_chart import BarPanel, Panel, bar_chart, log_log_chart

NS = "{http://www.w3.org/2000/svg}"


def _circles(svg: str) -> list[tuple[float, float]]:
    root = ET.fromstring(svg)
    return [(float(c.get("cx", "nan")), float(c.get("cy", "nan"))) for c in root.iter(f"{NS}circle")]


def test_points_a_decade_apart_are_equally_spaced_and_larger_values_sit_higher() -> None:
    svg = log_log_chart([Panel("t", "s", {"a": [(10, 0.01), (100, 0.1), (1000, 1.0)]})], caption="load 1.0")
    (x1, y1), (x2, y2), (x3, y3) = _circles(svg)
    assert x2 - x1 == pytest.approx(x3 - x2, abs=0.2)
    assert y1 - y2 == pytest.approx(y2 - y3, abs=0.2)
    assert x1 < x2 < x3
    assert y1 > y2 > y3  # SVG's y grows downwards
    assert "load 1.0" in svg


def test_two_panels_side_by_side_with_every_series_named() -> None:
    svg = log_log_chart(
        [
            Panel("cpu", "ms", {"grpc": [(256, 0.5), (4096, 0.4)]}),
            Panel("wall", "s", {"grpc": [(256, 0.2)], "torch": [(64, 2.0)]}),
        ]
    )
    root = ET.fromstring(svg)
    assert root.get("width") == "840"
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert {"cpu", "wall", "grpc", "torch"} <= set(texts)
    assert all(x >= 420 for x, _ in _circles(svg)[2:])  # the second panel's points are in its half


@pytest.mark.parametrize("points", [[], [(0, 1.0)], [(10, -1.0)]])
def test_a_panel_a_log_scale_cannot_show_is_refused(points: list[tuple[float, float]]) -> None:
    with pytest.raises(ValueError, match="panel 'p'"):
        log_log_chart([Panel("p", "s", {"a": points})])


def _bars(svg: str) -> list[tuple[float, float, str]]:
    root = ET.fromstring(svg)
    return [
        (float(r.get("width", "nan")), float(r.get("y", "nan")), r.get("fill", ""))
        for r in root.iter(f"{NS}rect")
        if r.get("height") == "12"  # the bars (legend swatches are 10 high)
    ]


def test_bars_are_proportional_to_their_values_one_colour_per_series() -> None:
    svg = bar_chart([BarPanel("t", "s", {"P1": {"rallypoint": 1.0, "torch": 4.0}, "P3": {"rallypoint": 2.0}})])
    (w1, y1, c1), (w2, y2, c2), (w3, y3, c3) = _bars(svg)
    assert w2 == pytest.approx(4 * w1, rel=0.01)
    assert w3 == pytest.approx(2 * w1, rel=0.01)
    assert y1 < y2 < y3  # rows top to bottom, in order
    assert c1 == c3 != c2  # rallypoint keeps its colour across rows
    texts = [t.text for t in ET.fromstring(svg).iter(f"{NS}text")]
    assert {"P1", "P3", "rallypoint", "torch"} <= set(texts)


def test_bar_panels_sit_side_by_side_and_bad_values_are_refused() -> None:
    svg = bar_chart([BarPanel("a", "s", {"x": {"r": 1.0}}), BarPanel("b", "MiB", {"y": {"r": 3.0}})], caption="c")
    assert ET.fromstring(svg).get("width") == "840"
    with pytest.raises(ValueError, match="values >= 0"):
        bar_chart([BarPanel("a", "s", {"x": {"r": -1.0}})])
    with pytest.raises(ValueError, match="no values"):
        bar_chart([BarPanel("a", "s", {})])
    with pytest.raises(ValueError, match="at least one panel"):
        bar_chart([])


def test_a_legend_can_sit_bottom_right_and_large_x_values_read_as_powers() -> None:
    svg = log_log_chart([Panel("t", "ms", {"a": [(16, 0.4), (1048576, 1.5)]}, x_label="bytes", legend="bottom-right")])
    root = ET.fromstring(svg)
    legend = next(t for t in root.iter(f"{NS}text") if t.text == "a")
    assert float(legend.get("x", "0")) > 420 / 2
    assert float(legend.get("y", "0")) > 300 / 2
    assert "1e6" in [t.text for t in root.iter(f"{NS}text")]
    with pytest.raises(ValueError, match="legend 'middle'"):
        log_log_chart([Panel("t", "ms", {"a": [(1, 1)]}, legend="middle")])
