"""The plot without a model: the smoothing window, the series picked from metrics rows, and the figure."""

import json

import pytest

from rlt_mono.runs.outputs import METRICS_FILE
from rlt_mono.runs.plots import draw_metric_series, metric_series, plot_metrics, running_mean, smoothing_window


def _step_row(step, reward, **extra):
    return {"event": "step", "step": step, "reward": reward, "teacher_reward/total": reward, **extra}


def test_smoothing_window_grows_with_the_run():
    assert [smoothing_window(n) for n in (1, 3, 4, 10, 16, 40, 100, 1000)] == [1, 1, 3, 3, 5, 7, 11, 31]
    assert running_mean([0.0, 3.0, 6.0, 9.0], 3) == [1.5, 3.0, 6.0, 7.5]


def test_series_drop_total_equal_to_reward_and_add_unmatched():
    rows = [_step_row(s, -float(s), **{"teacher_reward/r_ss": -0.5, "teacher_reward/r_kl": 0.25,
                                       "alignment/unmatched_frac": 0.5, "completions/clipped_ratio": 0.25,
                                       "phase/train/seconds": 1.0, "phase/generate/seconds": 2.0})
            for s in range(1, 11)]
    rows.append({"event": "summary", "step": 10, "train_runtime": 5.0})
    panels = metric_series(rows)
    assert list(panels) == ["reward", "unmatched", "seconds"]
    assert [s.label for s in panels["reward"]] == ["reward (= r_ss - r_kl + match_penalty)",
                                                   "r_ss (student log-prob of the solution)", "r_kl (subtracted)"]
    reward = panels["reward"][0]
    assert reward.steps == list(range(1, 11)) and reward.values == [-float(s) for s in range(1, 11)]
    assert reward.smoothed[0] == -1.5 and reward.smoothed[4] == -5.0  # window 3 for 10 points
    assert [s.label for s in panels["unmatched"]] == ["explanation never closed (unmatched)",
                                                      "cut at max_completion_length"]
    assert [s.label for s in panels["seconds"]] == ["generate", "train"]
    rows[3]["teacher_reward/total"] = 7.0  # total differs from TRL's reward: both are drawn
    assert "total" in [s.label for s in metric_series(rows)["reward"]]
    assert list(metric_series([_step_row(1, 1.0, **{"completions/clipped_ratio": 1.0})])) == ["reward"]


def test_figure_draws_points_and_lines_with_legends_outside(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text("".join(json.dumps(_step_row(s, -s / 10, **{"alignment/unmatched_frac": 0.1})) + "\n"
                            for s in range(1, 11)))
    panels = plot_metrics(path, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    fig = draw_metric_series(panels)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    top, middle = fig.axes
    points, line = top.get_lines()[:2]
    assert list(points.get_ydata()) == panels["reward"][0].values and points.get_alpha() < 1
    assert list(line.get_ydata()) == pytest.approx(panels["reward"][0].smoothed)
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["reward (= r_ss - r_kl + match_penalty)"]
    assert list(middle.get_lines()[0].get_ydata()) == pytest.approx([10.0] * 10)  # percent
    for ax in fig.axes:  # the legend sits right of the plotting area, covering no point
        assert ax.get_legend().get_window_extent(renderer).x0 > ax.get_window_extent(renderer).x1
