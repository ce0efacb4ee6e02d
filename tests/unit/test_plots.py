"""The PNG plots the commands write (matplotlib, the `plot` extra): `decidealot calibrate
--plot`'s reliability diagram, and the message that names the extra where matplotlib is not
installed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from decidealot.providers import calibrate, plots

BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)
"""matplotlib's first two curve colours."""


def _colours(path: Path) -> set[tuple[int, int, int]]:
    from matplotlib.image import imread

    pixels = (imread(path)[..., :3] * 255).round().astype(int)
    return {tuple(p) for p in pixels.reshape(-1, 3).tolist()}


def test_a_line_plot_is_a_png_with_every_curve(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    series = [("one", [0.1, 0.5, 0.9], [0.2, 0.4, 0.95]), ("two", [0.3, 0.7], [0.1, 0.8])]
    plots.line_plot(path, series, xlabel="x", ylabel="y", diagonal="x = y")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {BLUE, ORANGE} <= _colours(path)


def test_the_reliability_diagram_draws_each_non_empty_bin_before_and_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: dict[str, Any] = {}

    def line_plot(path: Path, series: list[plots.Series], **options: Any) -> None:
        drawn.update(options, series=series)

    monkeypatch.setattr(calibrate, "line_plot", line_plot)
    gold = [1, 0, 0, 1]
    before = [[0.2, 0.8], [0.6, 0.4], [0.9, 0.1], [0.3, 0.7]]
    after = [[0.4, 0.6], [0.55, 0.45], [0.8, 0.2], [0.35, 0.65]]
    outcome = calibrate.Outcome({}, [], 4, [], before=before, after=after, gold=gold)
    calibrate.plot(tmp_path / "plot.png", outcome)
    for (label, xs, ys), name, probs in zip(
        drawn["series"], ("before", "after"), (before, after), strict=True
    ):
        ece = calibrate.expected_calibration_error(probs, gold)
        assert label == f"{name} (ECE {ece:.3f})"
        bins = [(c, a) for n, c, a in calibrate.reliability(probs, gold) if n]
        assert list(zip(xs, ys, strict=True)) == bins and len(bins) >= 2
    assert (drawn["xlabel"], drawn["ylabel"]) == ("confidence", "accuracy")
    assert drawn["diagonal"] == "perfect calibration"


def test_without_matplotlib_the_plot_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as when not installed
    with pytest.raises(SystemExit, match=r"matplotlib: pip install 'decidealot\[plot\]'"):
        plots.line_plot(tmp_path / "plot.png", [], xlabel="x", ylabel="y")
    assert not (tmp_path / "plot.png").exists()
