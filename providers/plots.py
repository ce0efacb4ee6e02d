"""Line plots the commands write as PNG files (`decidealot calibrate --plot`), with matplotlib:
the optional `plot` extra, imported only to draw, on its Agg canvas (no pyplot global state)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

EXTRA = "pip install 'decidealot[plot]'"

Series = tuple[str, Sequence[float], Sequence[float]]  # one curve: legend label, xs, ys


def line_plot(
    path: Path, series: Sequence[Series], *, xlabel: str, ylabel: str, diagonal: str | None = None
) -> None:
    """`series` as marked curves over [0, 1] x [0, 1], and a dashed `diagonal` when named."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise SystemExit(f"decidealot: drawing {path} needs matplotlib: {EXTRA}") from None
    figure = Figure(figsize=(5.2, 5.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    if diagonal is not None:
        axes.plot([0, 1], [0, 1], linestyle="--", color="0.6", label=diagonal)
    for label, xs, ys in series:
        axes.plot(xs, ys, marker="o", label=label)
    axes.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), xlabel=xlabel, ylabel=ylabel, aspect="equal")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    figure.savefig(path, format="png")
