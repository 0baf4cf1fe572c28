"""tools/bench/svg_chart.py: a log-log chart as SVG text, points placed by their logarithms."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tools.bench.svg_chart import Panel, log_log_chart

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
