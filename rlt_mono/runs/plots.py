"""The plot of a run: ``reward_components.png``, drawn from ``metrics.jsonl`` at the end of training.

Three panels stacked over the optimizer step: the reward and its RLT components, the share of unmatched (and
clipped) explanations, and seconds per phase. Each metric is drawn as light per-step points and a running mean
whose window grows like sqrt(steps) (``smoothing_window``). ``metric_series`` picks the series from the rows,
``draw_metric_series`` draws them (a notebook shows the figure), ``plot_metrics`` writes the PNG.

The "Does it teach?" study over seeds (``rlt_mono.study.aggregate``) draws three more: the held-out reward per RL
step (``plot_heldout_reward_by_seed``), the tied-group share before and after refill
(``plot_tied_groups_by_seed``) and the students' accuracy by arm (``plot_arms_accuracy``).
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from rlt_mono.runs.atomic_write import write_bytes
from rlt_mono.runs.outputs import EVAL_EVENT, STEP_EVENT, in_phase_order, is_number, read_metrics, row_event

logger = logging.getLogger(__name__)


class Series(NamedTuple):
    """One plotted metric: raw per-step values (drawn as light points) and their running mean (the line)."""

    label: str
    steps: list[int]
    values: list[float]
    smoothed: list[float]


# (metrics key, label, colour) of the reward panel, in legend order; ``total`` only when it is not ``reward``.
REWARD_SERIES = (
    ("reward", "reward (= r_ss - r_kl + match_penalty)", "black"),
    ("teacher_reward/total", "total", "tab:gray"),
    ("teacher_reward/r_ss", "r_ss (student log-prob of the solution)", "tab:blue"),
    ("teacher_reward/r_kl", "r_kl (subtracted)", "tab:red"),
    ("teacher_reward/match_penalty", "match_penalty", "tab:orange"),
)
UNMATCHED_SERIES = (
    ("alignment/unmatched_frac", "explanation never closed (unmatched)", "tab:purple"),
    ("completions/clipped_ratio", "cut at max_completion_length", "tab:brown"),
)
# (metrics key of the eval rows, label, colour): the held-out learning curve.
EVAL_SERIES = ("eval_reward", "held-out reward (eval)", "tab:green")
PHASE_COLOURS = {"generate": "tab:green", "score": "tab:olive", "train": "tab:cyan"}


def smoothing_window(n: int) -> int:
    """Odd running-mean window for ``n`` points, growing like sqrt(n): 1 up to 3 points, 3 from 4, 5 from 16,
    7 from 36, 11 for 100, 31 for 1000."""
    return 2 * int(math.sqrt(n) / 2) + 1 if n > 0 else 1


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """Centred running mean; the window shrinks at both ends (``window`` odd)."""
    half = window // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half): i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _series(rows: Sequence[Mapping], key: str, label: str) -> Series | None:
    points = [(row["step"], float(row[key])) for row in rows if is_number(row.get(key))]
    if not points:
        return None
    steps, values = [s for s, _ in points], [v for _, v in points]
    return Series(label, steps, values, running_mean(values, smoothing_window(len(values))))


def metric_series(rows: Sequence[Mapping]) -> dict[str, list[Series]]:
    """What ``plot_metrics`` draws, panel by panel: ``reward`` (TRL's reward and the RLT components; ``total``
    left out where it equals ``reward``; the held-out reward of ``eval`` rows when there are any), ``unmatched``
    (fractions, when logged) and ``seconds`` (per phase)."""
    eval_rows = [row for row in rows if row_event(row) == EVAL_EVENT]
    rows = [row for row in rows if row_event(row) == STEP_EVENT]
    reward_keys = [key for key, _, _ in REWARD_SERIES]
    extra = sorted({k for row in rows for k in row if k.startswith("teacher_reward/") and k.count("/") == 1}
                   - set(reward_keys))
    labels = {key: label for key, label, _ in REWARD_SERIES}
    panels: dict[str, list[Series]] = {"reward": [], "unmatched": [], "seconds": []}
    for key in [*reward_keys, *extra]:
        if key == "teacher_reward/total" and _same_values(rows, key, "reward"):
            continue
        series = _series(rows, key, labels.get(key, key.removeprefix("teacher_reward/")))
        if series is not None:
            panels["reward"].append(series)
    if (held_out := _series(eval_rows, EVAL_SERIES[0], EVAL_SERIES[1])) is not None:
        panels["reward"].append(held_out)
    # Clipped completions are shown only beside the unmatched ones, as the usual reason an explanation never closes.
    if any(is_number(row.get(UNMATCHED_SERIES[0][0])) for row in rows):
        panels["unmatched"] = [s for key, label, _ in UNMATCHED_SERIES if (s := _series(rows, key, label))]
    phases = {k.split("/")[1] for row in rows for k in row if k.startswith("phase/") and k.endswith("/seconds")}
    for phase in in_phase_order(phases):
        series = _series(rows, f"phase/{phase}/seconds", phase)
        if series is not None:
            panels["seconds"].append(series)
    return {name: series for name, series in panels.items() if series}


def _same_values(rows: Sequence[Mapping], key: str, other: str) -> bool:
    pairs = [(row.get(key), row.get(other)) for row in rows if is_number(row.get(key))]
    return all(is_number(b) and abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in pairs)


def draw_metric_series(panels: Mapping[str, Sequence[Series]]):
    """A matplotlib figure of ``metric_series``'s panels, stacked, sharing the step axis; legends right of the
    axes. Returns the figure, on an Agg canvas of its own (pyplot's state and backend are left alone, so a
    notebook's inline plots keep working)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    series_tables = (REWARD_SERIES, UNMATCHED_SERIES, [EVAL_SERIES])
    colours = {label: colour for table in series_tables for _, label, colour in table}
    colours.update(PHASE_COLOURS)
    titles = {
        "reward": "RLT teacher reward per step (mean over the step's completions)",
        "unmatched": "share of the step's completions",
        "seconds": "seconds per step, by phase",
    }
    names = list(panels)
    fig = Figure(figsize=(11, 3.2 * len(names)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        percent = name == "unmatched"
        scale = 100.0 if percent else 1.0
        window = 1
        for i, series in enumerate(panels[name]):
            colour = colours.get(series.label, f"C{i}")
            window = max(window, smoothing_window(len(series.values)))
            ax.plot(series.steps, [v * scale for v in series.values], linestyle="none", marker="o", markersize=3,
                    alpha=0.35, color=colour)
            # Dashed after the first line of a panel: series that coincide (often all at 0%) stay distinguishable.
            ax.plot(series.steps, [v * scale for v in series.smoothed], color=colour, label=series.label,
                    linewidth=2.4 if series.label.startswith("reward") else 1.6,
                    linestyle="--" if percent and i else "-")
        if percent:  # a fraction: 0 to at least 10%, so a flat 0% reads as "none" rather than as noise
            top = max([10.0] + [v * scale for series in panels[name] for v in series.values])
            ax.set_ylim(-0.04 * top, 1.08 * top)
            ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
        if name == "reward":
            ax.axhline(0.0, color="lightgray", linewidth=0.8, zorder=0)
        ax.set_title(titles[name] + (f"; lines: running mean over {window} steps" if window > 1 else ""),
                     fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    axes[-1, 0].set_xlabel("optimizer step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def plot_metrics(metrics_path: str | Path, out_path: str | Path) -> dict[str, list[Series]]:
    """Draw the step rows of ``metrics_path`` into the PNG ``out_path``; returns the series drawn
    (``metric_series``)."""
    panels = metric_series(read_metrics(metrics_path) + read_metrics(metrics_path, EVAL_EVENT))
    if not panels:
        logger.info("%s has no step metrics to plot", metrics_path)
        return panels
    _write_png(draw_metric_series(panels), out_path)
    return panels


# ---- the "Does it teach?" study over seeds (rlt_mono.study.aggregate) -----------------------------------------
# A curve: [[step, value], ...] in step order, as study.json's "rl" entries hold it.
Curve = Sequence[Sequence[float]]


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the ``window - 1`` before it (fewer at the start): a rolling mean that, unlike
    ``running_mean``, reads no later step."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1): i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _study_figure(height: float = 4.0):
    """An empty figure on an Agg canvas of its own (pyplot's state and backend left alone) and its one axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, height))
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _write_png(fig, out_path: str | Path) -> None:
    """``fig`` as a PNG at ``out_path``, written whole (the old plot or all of the new: a reader beside a running
    run never opens half a file)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100, bbox_inches="tight")
    write_bytes(out_path, png.getvalue())
    logger.info("wrote %s", out_path)


def _save(fig, out_path: str | Path) -> None:
    fig.tight_layout()
    _write_png(fig, out_path)


def plot_heldout_reward_by_seed(curves: Mapping[int, Curve], out_path: str | Path) -> bool:
    """The RL teacher's held-out reward (``eval_reward``) against the optimizer step, one line per seed, into the
    PNG ``out_path``. Returns whether it was drawn (False, logged, when no seed has a point)."""
    curves = {seed: curve for seed, curve in curves.items() if curve}
    if not curves:
        logger.info("no held-out reward curve in any seed: no %s", out_path)
        return False
    from matplotlib.ticker import MaxNLocator

    fig, ax = _study_figure()
    for i, (seed, curve) in enumerate(sorted(curves.items())):
        ax.plot([step for step, _ in curve], [value for _, value in curve], marker="o", markersize=3,
                color=f"C{i}", label=f"seed {seed}")
    ax.set_title("RL teacher: held-out reward (frozen student) by optimizer step", fontsize=10, loc="left")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out reward")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    _save(fig, out_path)
    return True


def plot_tied_groups_by_seed(before: Mapping[int, Curve], after: Mapping[int, Curve], out_path: str | Path,
                             window: int = 10) -> bool:
    """The share of GRPO groups whose completions all got the same reward, per step, before the refill (solid)
    and after it (dashed), one colour per seed, each a ``trailing_mean`` over ``window`` steps, into the PNG
    ``out_path``. Returns whether it was drawn (False, logged, when no seed has a point)."""
    seeds = sorted(seed for seed in {*before, *after} if before.get(seed) or after.get(seed))
    if not seeds:
        logger.info("no tied-group fractions in any seed: no %s", out_path)
        return False
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    fig, ax = _study_figure()
    for i, seed in enumerate(seeds):
        for curve, when, style in ((before.get(seed), "before refill", "-"), (after.get(seed), "after refill", "--")):
            if curve:
                ax.plot([step for step, _ in curve], [100 * v for v in trailing_mean([v for _, v in curve], window)],
                        color=f"C{i}", linestyle=style, label=f"seed {seed}, {when}")
    ax.set_title(f"RL: share of tied groups (all completions rewarded alike); rolling mean over {window} steps",
                 fontsize=10, loc="left")
    ax.set_xlabel("optimizer step")
    ax.set_ylim(-4, 104)
    ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    _save(fig, out_path)
    return True


def plot_arms_accuracy(accuracy: Mapping[str, Mapping[str, tuple[float, float, float] | None]],
                       out_path: str | Path) -> bool:
    """Grouped bars of student accuracy: one group per held-out set, one bar per arm, error bars from each
    ``(accuracy, low, high)`` interval, into the PNG ``out_path``. ``accuracy`` is arm -> held-out set -> that
    triple, or None for an arm that did not run (no bar). Returns whether it was drawn (False, logged, when no
    arm has a figure)."""
    sets = list(dict.fromkeys(name for by_set in accuracy.values() for name in by_set))
    if not any(cell is not None for by_set in accuracy.values() for cell in by_set.values()):
        logger.info("no arm has an accuracy: no %s", out_path)
        return False
    from matplotlib.ticker import PercentFormatter

    fig, ax = _study_figure()
    width = 0.8 / len(accuracy)
    for i, (arm, by_set) in enumerate(accuracy.items()):
        drawn = [(j, cell) for j, name in enumerate(sets) if (cell := by_set.get(name)) is not None]
        if not drawn:  # an arm that did not run keeps its slot and colour, with no bar nor legend entry
            continue
        ax.bar([j - 0.4 + width * (i + 0.5) for j, _ in drawn], [100 * mean for _, (mean, _, _) in drawn], width,
               yerr=[[100 * (mean - low) for _, (mean, low, _) in drawn],
                     [100 * (high - mean) for _, (mean, _, high) in drawn]],
               capsize=3, color=f"C{i}", label=arm)
    ax.set_xticks(range(len(sets)), sets)
    ax.set_title("student accuracy on held-out questions (pooled over seeds; bars: 95% bootstrap interval)",
                 fontsize=10, loc="left")
    ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    _save(fig, out_path)
    return True
