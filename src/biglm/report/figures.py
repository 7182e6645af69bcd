"""The report's figures (matplotlib, PNG): loss and ARC average against tokens, one line per run.

- Fig. 3 layout (paper §5, scaling): every run, labelled with its size; Fig. 4 layout (corpora): the same
  curves labelled by training corpus, drawn when the runs cover at least two corpora.
- Left panel: the training loss (long runs averaged into at most ``max_points`` bins so a 300k-step curve
  stays readable) with the validation loss as markers; right panel: the ARC-E/ARC-C average of the
  in-training evaluations (``--eval_tasks_every``) with its standard error.
- A dotted vertical line in the run's colour marks where its WSD annealing starts (tokens seen after
  ``steps - anneal_steps`` steps); the positions drawn are returned in `Figure.anneal`.
- Losses of runs with another tokenizer than the reference one are not drawn (their ARC curves are): nats
  per token of different vocabularies do not compare.

Matplotlib's object API with the Agg canvas: no pyplot, no global backend switch, no display needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .inputs import Curve, Run, Skip

__all__ = ["Figure", "draw_curves", "size_label"]


@dataclass
class Figure:
    key: str
    title: str
    path: Path
    caption: str
    lines: dict[str, dict[str, int]] = field(default_factory=dict)
    """label -> points drawn per panel ("loss", "val_loss", "arc")"""
    anneal: dict[str, dict[str, float]] = field(default_factory=dict)
    """label -> {"step": steps completed when annealing starts, "tokens": tokens seen then} (the marker's x)"""


def size_label(params: int | None) -> str:
    if params is None:
        return "size unknown"
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= div:
            return f"{params / div:.3g}{unit} params"
    return f"{params} params"


def _tokens_tick(x: float, _pos: int) -> str:
    """Token counts as LM papers write them: 500k, 1.5M, 100B."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:g}{unit}"
    return f"{x:g}"


def _binned(curve: Curve, max_points: int) -> tuple[list[float], list[float]]:
    n = len(curve.values)
    if n <= max_points:
        return curve.tokens, curve.values
    k = math.ceil(n / max_points)
    xs, ys = [], []
    for i in range(0, n, k):
        xs.append(sum(curve.tokens[i:i + k]) / len(curve.tokens[i:i + k]))
        ys.append(sum(curve.values[i:i + k]) / len(curve.values[i:i + k]))
    return xs, ys


def draw_curves(runs: list[Run], *, key: str, title: str, path: Path, labels: dict[str, str], caption: str,
                reference: str | None, max_points: int, skipped: list[Skip], colors: dict[str, str] | None = None
                ) -> Figure:
    """Draw loss and ARC average against tokens for ``runs`` (legend text ``labels[run.label]``, line colour
    ``colors[run.label]``, so a run keeps its colour across figures) into ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    fig_info = Figure(key=key, title=title, path=path, caption=caption)
    fig = MplFigure(figsize=(12, 4.4), dpi=110)
    FigureCanvasAgg(fig)
    ax_loss, ax_arc = fig.subplots(1, 2, sharex=True)
    colors = colors or {}
    handles = []
    any_val = any_anneal = False
    for i, run in enumerate(runs):
        color = colors.get(run.label, f"C{i % 10}")
        drawn = {"loss": 0, "val_loss": 0, "arc": 0}
        comparable = reference is None or run.tokenizer is None or run.tokenizer == reference
        if not comparable and (run.loss or run.val_loss):
            skipped.append(Skip(f"{key}: {run.label} loss", f"its tokenizer ({run.tokenizer_desc}) is not the reference "
                                "one: per-token losses of different vocabularies do not compare (its ARC curve is drawn)"))
        if comparable and run.loss is not None:
            xs, ys = _binned(run.loss, max_points)
            ax_loss.plot(xs, ys, color=color, lw=1.4)
            drawn["loss"] = len(xs)
        if comparable and run.val_loss is not None:
            ax_loss.plot(run.val_loss.tokens, run.val_loss.values, "o", color=color, ms=3.5, mfc="white")
            drawn["val_loss"] = len(run.val_loss.values)
            any_val = True
        if run.arc is not None:
            errs = run.arc.stderr if run.arc.stderr and all(e is not None for e in run.arc.stderr) else None
            ax_arc.errorbar(run.arc.tokens, run.arc.values, yerr=errs, color=color, marker="o", ms=3.5, lw=1.4,
                            capsize=2)
            drawn["arc"] = len(run.arc.values)
        if run.anneal_tokens is not None and (drawn["loss"] or drawn["val_loss"] or drawn["arc"]):
            for ax, has in ((ax_loss, drawn["loss"] or drawn["val_loss"]), (ax_arc, drawn["arc"])):
                if has:
                    ax.axvline(run.anneal_tokens, color=color, ls=":", lw=1.3)
            fig_info.anneal[run.label] = {"step": run.anneal_start, "tokens": run.anneal_tokens}
            any_anneal = True
        if any(drawn.values()):
            handles.append(Line2D([], [], color=color, lw=1.6, label=labels[run.label]))
            fig_info.lines[run.label] = drawn
    if any_val:
        handles.append(Line2D([], [], color="0.4", marker="o", mfc="white", ls="", label="validation loss"))
    if any_anneal:
        handles.append(Line2D([], [], color="0.4", ls=":", label="WSD annealing starts"))
    for ax in (ax_loss, ax_arc):
        ax.xaxis.set_major_formatter(FuncFormatter(_tokens_tick))
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    ax_loss.set_ylabel("masked-LM loss (nats/token)")
    ax_loss.set_title("training loss")
    arcs = {r.arc.what for r in runs if r.arc is not None}
    ax_arc.set_ylabel("ARC-E / ARC-C average (%)" if arcs <= {"ARC-E+ARC-C"} else
                      f"{' or '.join(sorted(a.replace('+', ' + ') for a in arcs))} accuracy (%)")
    ax_arc.set_title("ARC (in-training evaluations)")
    if not any(d["arc"] for d in fig_info.lines.values()):
        ax_arc.text(0.5, 0.5, "no in-training ARC evaluations\n(biglm pretrain --eval_tasks_every K)",
                    ha="center", va="center", transform=ax_arc.transAxes, color="0.4")
    if not any(d["loss"] or d["val_loss"] for d in fig_info.lines.values()):
        ax_loss.text(0.5, 0.5, "no comparable losses", ha="center", va="center", transform=ax_loss.transAxes,
                     color="0.4")
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), frameon=False, fontsize=8.5)
    rows = math.ceil(len(handles) / 4) if handles else 0
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.045 * rows + 0.02, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})  # no version stamp: the same runs, the same bytes
    return fig_info
