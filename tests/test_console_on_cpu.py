"""The terminal without a model: the step and summary lines, the compact callback (a bar only in a terminal), and
swapping transformers' progress display for it. A whole run into a pipe: tests/test_piped_log_on_cpu.py."""

import io
import logging
import sys
from types import SimpleNamespace

import datasets
import pytest
import transformers
from transformers import TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler, PrinterCallback, ProgressCallback
from transformers.utils.notebook import NotebookProgressCallback

from rlt_mono.runs.console import (
    CompactProgressCallback,
    format_step_line,
    format_summary_line,
    replace_progress_callback,
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


def test_step_line_is_one_compact_line():
    assert format_step_line(FULL_LOG, 12, 40) == (
        "step 12/40 | reward -2.71 (r_ss -1.90, r_kl 0.81, unmatched 6%) | 3.1 s/step (gen 1.2, score 0.8, train 1.1)"
    )


def test_step_line_omits_missing_keys():
    assert format_step_line({"reward": -0.004}, 3, 5) == "step 3/5 | reward -4.0e-03"
    # held-out evaluations (TRL's eval_ keys): RL's reward, SFT's loss
    assert format_step_line({"eval_reward": -8.0489}, 25, 200) == "step 25/200 | held-out reward -8.05"
    assert format_step_line({"eval_loss": 0.021347, "epoch": 1}, 4, 40) == "step 4/40 | held-out loss 0.02135"
    assert format_step_line({"phase/generate/seconds": 0.25, "phase/train/seconds": 0.5}, 1, 2) == (
        "step 1/2 | 0.75 s/step (gen 0.25, train 0.50)"  # no step_time: the phases' sum
    )
    # SFT: no reward, so the loss and learning rate; seconds per step as the callback measured them
    assert format_step_line({"loss": 0.1}, 1, 2) == "step 1/2 | loss 0.1"
    assert format_step_line({"loss": 1.23456, "learning_rate": 1e-5, "grad_norm": 3.0}, 8, 32, 0.4211) == (
        "step 8/32 | loss 1.235 | lr 1.0e-05 | 0.42 s/step")


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
    with caplog.at_level(logging.INFO, logger="rlt_mono.runs.console"):
        state.global_step = 1
        callback.on_log(args, state, control, logs=dict(FULL_LOG))
        callback.on_log(args, state, control, logs={"train_runtime": 3.0, "train_loss": 0.0})
    assert [r.getMessage() for r in caplog.records] == [
        format_step_line(FULL_LOG, 1, 2),
        "done: step 1/2 in 3.0 s (3.0 s/step) | mean reward -2.713 (step 1) | outputs in /runs/b",
    ]


@pytest.mark.parametrize("terminal", [True, False])
def test_compact_callback_draws_a_bar_only_in_a_terminal(monkeypatch, caplog, terminal):
    stderr = io.StringIO()  # where tqdm draws
    stderr.isatty = lambda: terminal
    monkeypatch.setattr(sys, "stderr", stderr)
    switched_off = []  # the libraries' switches, recorded rather than flipped for the rest of the session
    monkeypatch.setattr(transformers.utils.logging, "disable_progress_bar", lambda: switched_off.append("transformers"))
    monkeypatch.setattr(datasets, "disable_progress_bars", lambda: switched_off.append("datasets"))
    callback = CompactProgressCallback()
    args = SimpleNamespace(disable_tqdm=False, output_dir="/runs/c")
    state, control = _state(0, 2), TrainerControl()
    with caplog.at_level(logging.INFO, logger="rlt_mono.runs.console"):
        callback.on_train_begin(args, state, control)
        state.global_step = 1
        callback.on_step_end(args, state, control)
        callback.on_log(args, state, control, logs=dict(FULL_LOG))
        callback.on_train_end(args, state, control)
    logged = [r.getMessage() for r in caplog.records]
    if terminal:  # the training bar, the line written above it by tqdm
        assert "1/2" in stderr.getvalue() and "\r" in stderr.getvalue() and not logged
    else:  # a file or a pipe: no bar, the line is the progress
        assert stderr.getvalue() == "" and logged == [format_step_line(FULL_LOG, 1, 2)]
    assert switched_off == ["transformers", "datasets"]  # the training bar is the only one, in a terminal too


@pytest.mark.parametrize("default", [ProgressCallback, NotebookProgressCallback, PrinterCallback])
def test_replace_progress_callback_removes_whichever_transformers_added(default):
    handler = CallbackHandler([default()], None, None, None, None)
    trainer = SimpleNamespace(callback_handler=handler, remove_callback=handler.remove_callback,
                              add_callback=handler.add_callback)
    added = replace_progress_callback(trainer)
    assert handler.callbacks == [added] and isinstance(added, CompactProgressCallback)


def test_a_run_without_reward_spread_is_warned_about_once(caplog):
    from types import SimpleNamespace

    from rlt_mono.runs.console import NoLearningSignalWarning

    watch = NoLearningSignalWarning(window=3, threshold=0.9)
    main, other_rank = SimpleNamespace(is_world_process_zero=True), SimpleNamespace(is_world_process_zero=False)
    with caplog.at_level("WARNING", logger="rlt_mono.runs.console"):
        for spread in (1.0, 1.0, 0.5, 1.0, 1.0):  # windows: [1, 1, .5] -> 0.83, [1, .5, 1] -> 0.83, [.5, 1, 1] -> 0.83
            watch.on_log(None, main, None, logs={"frac_reward_zero_std": spread})
        assert not watch.warned
        for spread in (1.0, 1.0, 1.0):  # a data-parallel rank after the first leaves the warning to rank 0
            watch.on_log(None, other_rank, None, logs={"frac_reward_zero_std": spread})
        assert not watch.warned
        for spread in (1.0, 1.0, 1.0, 1.0):  # [1, 1, 1] -> warned once, not again
            watch.on_log(None, main, None, logs={"frac_reward_zero_std": spread})
    assert watch.warned
    warnings = [r.getMessage() for r in caplog.records if "no learning signal" in r.getMessage()]
    assert len(warnings) == 1 and "over the last 3 steps 100% of prompt groups" in warnings[0]
