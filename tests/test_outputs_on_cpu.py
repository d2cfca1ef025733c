"""Run outputs without a model: the progress lines, metrics/samples rows, resume repair, the plot's series and
figure, and the run folder's README."""

import json
import logging
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler, PrinterCallback, ProgressCallback
from transformers.utils.notebook import NotebookProgressCallback

from rlt_mono.errors import UserError
from rlt_mono.outputs import (
    METRICS_FILE,
    SAMPLES_FILE,
    Block,
    CompactProgressCallback,
    RunFilesCallback,
    draw_metric_series,
    drop_rows_after,
    format_step_line,
    format_summary_line,
    launch_command,
    metric_series,
    plot_metrics,
    read_metrics,
    replace_progress_callback,
    resume_command,
    reward_trend,
    running_mean,
    sample_row,
    smoothing_window,
    write_run_readme,
)

FULL_LOG = {
    "loss": 1e-7, "reward": -2.7134, "teacher_reward/r_ss": -1.9012, "teacher_reward/r_kl": 0.8122,
    "teacher_reward/total": -2.7134, "alignment/unmatched_frac": 0.0625, "phase/generate/seconds": 1.21,
    "phase/score/seconds": 0.84, "phase/train/seconds": 1.07, "step_time": 3.14, "perf/mfu": 0.1,
}


def _state(step, max_steps=40):
    state = TrainerState(max_steps=max_steps)
    state.global_step = step
    return state


def _step_row(step, reward, **extra):
    return {"event": "step", "step": step, "reward": reward, "teacher_reward/total": reward, **extra}


# ---- the terminal -----------------------------------------------------------------------------------------
def test_step_line_is_one_compact_line():
    assert format_step_line(FULL_LOG, 12, 40) == (
        "step 12/40 | reward -2.71 (r_ss -1.90, r_kl 0.81, unmatched 6%) | 3.1 s/step (gen 1.2, score 0.8, train 1.1)"
    )


def test_step_line_omits_missing_keys():
    assert format_step_line({"reward": -0.004}, 3, 5) == "step 3/5 | reward -4.0e-03"
    assert format_step_line({"phase/generate/seconds": 0.25, "phase/train/seconds": 0.5}, 1, 2) == (
        "step 1/2 | 0.75 s/step (gen 0.25, train 0.50)"  # no step_time: the phases' sum
    )
    assert format_step_line({"loss": 0.1}, 1, 2) == "step 1/2"


def test_summary_line_says_time_trend_and_folder():
    rewards = [(step, float(step)) for step in range(31, 41)]  # a resumed call: steps 31-40, window 3
    line = format_summary_line({"train_runtime": 125.0, "train_loss": 0.0}, 40, 40, 10, rewards, "/runs/a")
    assert line == ("done: step 40/40 in 2 min 5 s (12.5 s/step) | mean reward 32.000 (steps 31-33) -> 39.000 "
                    "(steps 38-40) | outputs in /runs/a")


def test_compact_callback_writes_lines_not_dicts(caplog):
    callback = CompactProgressCallback()
    args = SimpleNamespace(disable_tqdm=True, output_dir="/runs/b")  # no bar: the lines go to logging
    state, control = _state(0, 2), TrainerControl()
    callback.on_train_begin(args, state, control)
    with caplog.at_level(logging.INFO, logger="rlt_mono.outputs"):
        state.global_step = 1
        callback.on_log(args, state, control, logs=dict(FULL_LOG))
        callback.on_log(args, state, control, logs={"train_runtime": 3.0, "train_loss": 0.0})
    assert [r.getMessage() for r in caplog.records] == [
        format_step_line(FULL_LOG, 1, 2),
        "done: step 1/2 in 3.0 s (3.0 s/step) | mean reward -2.713 (step 1) | outputs in /runs/b",
    ]


@pytest.mark.parametrize("default", [ProgressCallback, NotebookProgressCallback, PrinterCallback])
def test_replace_progress_callback_removes_whichever_transformers_added(default):
    handler = CallbackHandler([default()], None, None, None, None)
    trainer = SimpleNamespace(remove_callback=handler.remove_callback, add_callback=handler.add_callback)
    added = replace_progress_callback(trainer)
    assert handler.callbacks == [added] and isinstance(added, CompactProgressCallback)


# ---- metrics.jsonl and samples.jsonl ---------------------------------------------------------------------
def test_rows_are_marked_step_or_summary_and_samples_lead_with_question(tmp_path):
    scores = [{"completion": "c", "r_kl": 0.5, "explanation": "e", "total": -1.0, "r_ss": -0.5, "flag": False,
               "solution": "s", "question": "q", "match_penalty": 0.0}] * 3
    callback = RunFilesCallback(tmp_path, SimpleNamespace(last_scores=scores), samples_per_step=2, plot=False)
    args, control = SimpleNamespace(), TrainerControl()
    callback.on_log(args, _state(1), control, logs={"reward": -1.0, "loss": float("nan")})
    callback.on_log(args, _state(1), control, logs={"train_runtime": 9.5, "train_loss": 0.0})
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"event": "step", "step": 1, "reward": -1.0, "loss": None},
        {"event": "summary", "step": 1, "train_runtime": 9.5, "train_loss": 0.0},
    ]
    assert read_metrics(tmp_path / METRICS_FILE) == [{"event": "step", "step": 1, "reward": -1.0, "loss": None}]
    assert [r["train_runtime"] for r in read_metrics(tmp_path / METRICS_FILE, event="summary")] == [9.5]
    samples = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert len(samples) == 2  # samples_per_step, and none for the summary log
    assert list(samples[0]) == ["step", "question", "solution", "explanation", "total", "r_ss", "r_kl",
                                "match_penalty", "completion", "flag"]
    assert list(sample_row(4, {"explanation": "e", "x": 1})) == ["step", "explanation", "x"]


def test_read_metrics_skips_a_cut_last_line_and_old_summary_rows(tmp_path, caplog):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "reward": 1.0}\n{"step": 1, "train_runtime": 2.0}\n{"step": 2, "rew')
    with caplog.at_level(logging.WARNING):
        assert read_metrics(path) == [{"step": 1, "reward": 1.0}]  # rows written before "event" existed
    assert "(line 3), cut short" in caplog.text


def test_a_bad_line_inside_the_file_is_a_user_error(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1}\n{"step": 2,,}\n{"step": 3}\n')
    with pytest.raises(UserError) as err:
        read_metrics(path)
    assert str(err.value).startswith(f"{path}, line 2: not a JSON row (")
    with pytest.raises(UserError, match="line 2"):
        drop_rows_after(path, 1)
    assert path.read_text() == '{"step": 1}\n{"step": 2,,}\n{"step": 3}\n'  # left as it was


def test_resume_drops_later_steps_and_a_cut_last_line(tmp_path):
    metrics, samples = tmp_path / METRICS_FILE, tmp_path / SAMPLES_FILE
    rows = [{"event": "step", "step": 1}, {"event": "step", "step": 2}, {"event": "summary", "step": 2},
            {"event": "step", "step": 3}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "step", "st')
    samples.write_text('{"step": 2, "explanation": "a"}\n{"step": 3, "explanation": "b"}')  # no final newline
    RunFilesCallback(tmp_path).on_train_begin(SimpleNamespace(), _state(2), TrainerControl())
    assert metrics.read_text() == "".join(json.dumps(r) + "\n" for r in rows[:3])
    assert samples.read_text() == '{"step": 2, "explanation": "a"}\n'
    drop_rows_after(tmp_path / "absent.jsonl", 2)  # nothing to repair: no error


# ---- the plot -------------------------------------------------------------------------------------------
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


# ---- README -------------------------------------------------------------------------------------------
def test_reward_trend_uses_the_smoothing_window():
    assert reward_trend([1, 2, 3], [1.0, 2.0, 4.0]) == (Block(1, 1, 1.0), Block(3, 3, 4.0))
    steps = list(range(1, 11))
    assert reward_trend(steps, [float(s) for s in steps]) == (Block(1, 3, 2.0), Block(8, 10, 9.0))
    assert reward_trend([], []) is None


def test_resume_command_replaces_output_dir_and_resume(tmp_path):
    command = f"./launch_mono.sh demo_tiny trainer.max_steps=3 output_dir={tmp_path}/old resume_from_checkpoint=x"
    assert resume_command(command, tmp_path) == (
        f"./launch_mono.sh demo_tiny trainer.max_steps=3 output_dir={tmp_path} resume_from_checkpoint=true")


def test_run_readme_says_what_the_run_was(tmp_path):
    (tmp_path / "config.yaml").write_text("x: 1\n")
    (tmp_path / METRICS_FILE).write_text("")
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / ".partial-checkpoint-15").mkdir()
    (tmp_path / "final").mkdir()
    cfg = {"run_name": "demo_tiny", "seed": 0, "model": {"model_name_or_path": "embedded:teacher"},
           "student": {"model_name_or_path": "embedded:student"}, "data": {"source": "embedded", "max_rows": None},
           "trainer": {"max_steps": 10}}
    rows = [_step_row(s, float(s)) for s in range(1, 11)] + [{"event": "summary", "step": 10, "train_runtime": 1}]
    command = "./launch_mono.sh cfgs/run_cfg/demo_tiny.yaml trainer.max_steps=10"
    text = write_run_readme(tmp_path, cfg, rows, command=command).read_text()
    lines = text.splitlines()
    assert lines[0] == f"# rlt_mono run `demo_tiny`: {tmp_path.name}"
    assert f"| command | `{command}` |" in lines
    assert "| teacher (trained) | `embedded:teacher` |" in lines
    assert "| student (frozen, scores the explanations) | `embedded:student` |" in lines
    assert "| data | `embedded` |" in lines
    assert "| steps done | 10 of 10: finished; the trained teacher is in `final/` |" in lines
    assert "| mean reward | 2.000 (steps 1-3) -> 9.000 (steps 8-10) |" in lines
    files = [line.split("`")[1] for line in lines if line.startswith("- `")]
    assert files == ["config.yaml", "metrics.jsonl", "final/", "README.md", "checkpoint-5/", "checkpoint-10/"]
    assert f"{command} output_dir={tmp_path} resume_from_checkpoint=true" in lines
    assert "None" not in text


def test_run_readme_of_a_notebook_run_that_stopped(tmp_path):
    text = write_run_readme(tmp_path, {"run_name": "r", "trainer": {"max_steps": 40}}, [_step_row(1, -3.0)]
                            ).read_text()
    assert "| steps done | 1 of 40: stopped, or still running |" in text
    assert "| command | not recorded (built in Python" in text
    assert f"./launch_mono.sh <the run config and overrides of this run> output_dir={tmp_path} " \
           "resume_from_checkpoint=true" in text


def test_callback_writes_the_readme_at_each_save(tmp_path):
    callback = RunFilesCallback(tmp_path, plot=False, run_config={"run_name": "demo", "trainer": {"max_steps": 2}})
    callback.on_log(SimpleNamespace(), _state(1), TrainerControl(), logs={"reward": 0.5})
    callback.on_save(SimpleNamespace(), _state(1), TrainerControl())
    assert "| steps done | 1 of 2: stopped, or still running |" in (tmp_path / "README.md").read_text()


def test_launch_command_is_known_only_for_the_command_line_entry(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/repo/rlt_mono/train.py", "demo_tiny", "data.source=my rows.jsonl"])
    assert launch_command() == "./launch_mono.sh demo_tiny 'data.source=my rows.jsonl'"
    monkeypatch.setattr("sys.argv", ["/usr/bin/ipykernel_launcher.py", "-f", "kernel.json"])
    assert launch_command() is None
