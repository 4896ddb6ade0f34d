"""The picture of the evaluation: precision and coverage of accepted matches against the
threshold, per matcher (one panel each) and data set (one colour each)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: a file only
import matplotlib.pyplot as plt

# scored[matcher][data set] = [[gold tag or None, best tag or None, confidence], ...]
Scored = dict[str, dict[str, list[list[object]]]]

COLOURS = {
    "banking77": "#1f77b4",
    "hwu64": "#2ca02c",
    "zh": "#d62728",
    "all three": "#333333",
    "small registries, all": "#ff7f0e",
}


def curves(rows: list[list[object]], thresholds: list[float]) -> tuple[list[float], list[float]]:
    """Precision (right / accepted; 1 when nothing is accepted) and coverage (right /
    in-scope) at each threshold."""
    inside = sum(1 for gold, _, _ in rows if gold is not None)
    precision, coverage = [], []
    for th in thresholds:
        accepted = [(gold, tag) for gold, tag, conf in rows if float(conf) >= th]  # type: ignore[arg-type]
        right = sum(1 for gold, tag in accepted if gold is not None and gold == tag)
        precision.append(right / len(accepted) if accepted else 1.0)
        coverage.append(right / inside if inside else 0.0)
    return precision, coverage


def threshold_plot(scored: Scored, path: Path) -> None:
    thresholds = [i / 100 for i in range(30, 100)]
    matchers = [m for m in ("semantic", "lexical") if m in scored]
    fig, axes = plt.subplots(1, len(matchers), figsize=(6.2 * len(matchers), 4.6), sharey=True)
    if len(matchers) == 1:
        axes = [axes]
    for ax, matcher in zip(axes, matchers, strict=True):
        for ds, rows in scored[matcher].items():
            if ds not in COLOURS:
                continue
            precision, coverage = curves(rows, thresholds)
            colour = COLOURS[ds]
            width = 2.2 if ds == "all three" else 1.4
            ax.plot(thresholds, precision, color=colour, lw=width, label=f"{ds}: precision")
            ax.plot(thresholds, coverage, color=colour, lw=width, ls="--", label=f"{ds}: coverage")
        ax.axvline(0.8, color="#888888", lw=1, ls=":")
        ax.axhline(0.97, color="#888888", lw=1, ls=":")
        ax.text(0.805, 0.75, "default 0.8", color="#555555", fontsize=8)
        ax.text(0.31, 0.955, "97 %", color="#555555", fontsize=8, va="top")
        ax.set_title(f"{matcher} matcher (held-out queries)")
        ax.set_xlabel("confidence threshold")
        ax.set_xlim(0.3, 0.99)
        ax.set_ylim(0.0, 1.02)
        ax.grid(alpha=0.25)
    axes[0].set_ylabel("precision of accepted (solid), coverage (dashed)")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
