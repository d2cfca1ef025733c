"""A step whose gradient norm or loss is NaN or infinite stops the run there (rlt_mono.runs.diverged): transformers
would write the non-finite update into the weights, log the later losses as 0 and save a final model that writes
garbage. The SFT stage on CPU, made to diverge with an absurd learning rate, stops with one line and leaves no
final/ and no checkpoint of the diverged step."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlt_mono.config import compose
from rlt_mono.runs.diverged import StopOnNonFinite, TrainingDiverged, divergence_hint
from rlt_mono.runs.outputs import METRICS_FILE, read_metrics
from rlt_mono.stages.sft import run_sft

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("logs", [{"loss": 0.5, "grad_norm": math.nan}, {"loss": math.inf, "grad_norm": 1.0},
                                  {"loss": 0.5, "grad_norm": -math.inf}])
def test_a_non_finite_grad_norm_or_loss_raises_naming_the_step_and_the_resume(tmp_path, logs):
    (tmp_path / "checkpoint-20").mkdir()  # not a complete checkpoint (no manifest): nothing to resume from
    stop = StopOnNonFinite(tmp_path, "lower sft.learning_rate (it is 2e-06)")
    with pytest.raises(TrainingDiverged) as caught:
        stop.on_log(None, SimpleNamespace(global_step=37), None, logs=logs)
    message = str(caught.value)
    assert message.startswith("step 37: ")
    bad = [key for key in ("grad_norm", "loss") if not math.isfinite(logs[key])]
    assert all(f"{key} {logs[key]}" in message for key in bad)
    assert "lower sft.learning_rate (it is 2e-06)" in message and "start the run again" in message


def test_finite_and_absent_values_pass():
    stop = StopOnNonFinite("/nowhere", "hint")
    for logs in ({"loss": 0.0, "grad_norm": 0.0}, {"eval_loss": math.nan}, {}, None, {"loss": 1e38}):
        stop.on_log(None, SimpleNamespace(global_step=1), None, logs=logs)  # no error


def test_every_step_that_saves_is_logged_so_its_values_are_checked_first():
    from transformers import TrainerControl

    stop = StopOnNonFinite("/nowhere", "hint")
    cases = ((True, False, 4, True), (False, True, 4, True), (False, False, 10, True), (False, False, 4, False))
    for should_save, stopping, step, logged in cases:
        control = TrainerControl(should_save=should_save, should_training_stop=stopping)
        stop.on_step_end(None, SimpleNamespace(global_step=step, max_steps=10), control)
        assert control.should_log is logged


def test_the_hint_names_bf16_autocast_only_over_float32_weights():
    args = SimpleNamespace(bf16=True, learning_rate=2e-6)
    over_fp32 = divergence_hint("sft", args, torch.float32, "student")
    assert over_fp32 == ("student.dtype=float32 weights trained under sft.bf16=true (bfloat16 autocast): set "
                         "sft.bf16=false to train in float32 throughout, or lower sft.learning_rate (it is 2e-06)")
    assert divergence_hint("trainer", args, torch.bfloat16, "model") == "lower trainer.learning_rate (it is 2e-06)"
    args.bf16 = False
    assert divergence_hint("sft", args, torch.float32, "student") == "lower sft.learning_rate (it is 2e-06)"


@pytest.mark.parametrize(("logging_steps", "save_steps"), [(1, 1), (3, 2)])
def test_a_diverging_sft_run_stops_at_its_first_non_finite_step_without_a_final_model(tmp_path, tiny_pair,
                                                                                      logging_steps, save_steps):
    out = tmp_path / "run"
    # Adam's first updates move every weight by about the learning rate: at 1e30 the next forward overflows. Logged
    # every 3 steps and saved every 2, step 2 is still checked before it saves.
    overrides = ["size=tiny", f"output_dir={out}", "data.source=embedded", "data.embedded_rows=48",
                 "data.eval_rows=0", "sft.explanation_column=none", "sft.eval_strategy=no", "sft.learning_rate=1e30",
                 "sft.warmup_steps=0", "sft.max_steps=6", f"sft.save_steps={save_steps}",
                 "sft.per_device_train_batch_size=8", "+sft.disable_tqdm=true", f"sft.logging_steps={logging_steps}"]
    with pytest.raises(TrainingDiverged) as caught:
        run_sft(compose("student_sft", overrides))
    rows = [row for row in read_metrics(out / METRICS_FILE) if "loss" in row]
    diverged = next(row for row in rows if row["grad_norm"] is None or not math.isfinite(row["grad_norm"]))
    assert all(math.isfinite(row["grad_norm"]) for row in rows if row["step"] < diverged["step"])
    assert rows[-1]["step"] == diverged["step"] < 6  # the run went no further
    message = str(caught.value)
    assert message.startswith(f"step {diverged['step']}: grad_norm ")
    assert "lower sft.learning_rate (it is 1e+30)" in message
    assert diverged["step"] == 2  # step 1's update overflows step 2's forward
    if save_steps == 1:
        assert f"last complete checkpoint: {out / 'checkpoint-1'}" in message
    else:
        assert "start the run again" in message
    assert not (out / "final").exists() and not (out / "checkpoint-2").exists()
