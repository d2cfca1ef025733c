"""The run folder without a model: metrics/samples rows, reading them back, resume repair, and the README
written at each save."""

import json
import logging
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from rlt_mono.errors import UserError
from rlt_mono.runs.files import RunFilesCallback, sample_row
from rlt_mono.runs.outputs import METRICS_FILE, SAMPLES_FILE, drop_rows_after, read_metrics


def _state(step, max_steps=40):
    state = TrainerState(max_steps=max_steps)
    state.global_step = step
    return state


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


def test_callback_writes_the_readme_at_each_save(tmp_path):
    callback = RunFilesCallback(tmp_path, plot=False, run_config={"run_name": "demo", "trainer": {"max_steps": 2}})
    callback.on_log(SimpleNamespace(), _state(1), TrainerControl(), logs={"reward": 0.5})
    callback.on_save(SimpleNamespace(), _state(1), TrainerControl())
    assert "| steps done | 1 of 2: stopped, or still running |" in (tmp_path / "README.md").read_text()
