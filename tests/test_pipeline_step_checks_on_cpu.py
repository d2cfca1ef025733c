"""A pipeline checks every step's command line as the command line of a single stage is checked (unknown keys with
a "did you mean", types, ranges, held-out templates, the stage's own check) before its first step runs: a mistake in
the last step's overrides is one line naming the step, not an error after hours of the steps before it."""

import time

import pytest

from rlt_mono import cli
from rlt_mono.config import compose
from rlt_mono.stages import STAGES
from rlt_mono.stages.pipeline import StagePlan, resume_overrides, step_commands


@pytest.mark.parametrize(("override", "error"), [
    ("pipeline.teacher_rlt.overrides=['trainer.max_steps=-1']",
     "pipeline step teacher_rlt: trainer.max_steps must be > 0, got -1"),
    ("pipeline.teacher_sft.overrides=['size=tiny','sft.max_stepz=5']",
     "pipeline step teacher_sft: unknown key sft.max_stepz: did you mean sft.max_steps, sft.save_steps or "
     "sft.eval_steps?"),
    ("pipeline.eval.overrides=['size=tiny','data=gsm_symbolic','data.heldout_templates=[999]']",
     "pipeline step eval_teacher: data.heldout_templates: [999] not among the templates of data.source=gsm_symbolic"),
    ("pipeline.teacher_rlt.overrides=['placement.main_process_port=29600']",
     "pipeline step teacher_rlt: placement.main_process_port=29600: placement=dp's (one rank per GPU), ignored by "
     "placement=mono"),
    ("pipeline.distill.overrides=['size=tiny','data=gsm_symbolic','data.gsm_items_per_template=100000']",
     "pipeline step distill: data.gsm_items_per_template"),
])
def test_a_wrong_option_of_any_step_is_one_line_before_the_first_step_runs(override, error, tmp_path, capsys,
                                                                           launched):
    start = time.monotonic()
    assert cli.main(["pipeline_tiny", override, f"output_dir={tmp_path / 'p'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {error}") and err.count("\n") == 1, err
    assert launched == [] and not (tmp_path / "p").exists()
    assert time.monotonic() - start < 10  # composing and checking a dozen steps, no model loaded


def test_the_steps_checked_are_the_command_lines_the_pipeline_launches():
    cfg = compose("pipeline_tiny", ["output_dir=/p", "study=true"])
    commands = step_commands(cfg)
    assert STAGES["pipeline"].steps is step_commands
    assert [step for step, _, _ in commands][:6] == ["teacher_sft", "teacher_rlt", "distill", "student_sft",
                                                     "eval_teacher", "eval_student"]
    assert len(commands) == 12
    step, config, overrides = commands[2]
    assert config == "distill" and overrides[-3:] == [
        "output_dir=3_distill", "model.model_name_or_path=2_teacher_rlt/final", "model.gguf_file=null"]
    cli.check_steps(cfg)  # the pipeline's own steps pass their checks


def test_a_step_stopped_before_its_first_checkpoint_starts_again_and_damaged_checkpoints_are_kept(tmp_path):
    """Continuing a pipeline: a training step that left logs and no checkpoint starts again in an empty folder; one
    whose checkpoints are all incomplete (no manifest: cut short, or copied in part) is moved aside, not deleted."""
    logs_only, damaged = tmp_path / "1_teacher_sft", tmp_path / "2_teacher_rlt"
    for folder in (logs_only, damaged):
        folder.mkdir()
        (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (damaged / "checkpoint-2").mkdir()
    (damaged / "checkpoint-2" / "model.safetensors").write_bytes(b"cut")
    assert resume_overrides(StagePlan("teacher_sft", "teacher_sft", (), logs_only, {})) == []
    assert not logs_only.exists()
    assert resume_overrides(StagePlan("teacher_rlt", "teacher_rlt_mono", (), damaged, {})) == []
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("2_teacher_rlt.damaged-")]
    assert not damaged.exists() and len(kept) == 1
    assert (kept[0] / "checkpoint-2" / "model.safetensors").read_bytes() == b"cut"



def test_a_step_killed_by_a_signal_is_named_as_such(tmp_path, monkeypatch, capsys):
    """A stage killed (the out-of-memory killer, kill -9) wrote no message: the pipeline's line says what ended it."""
    monkeypatch.setattr("rlt_mono.stages.pipeline.run_stage", lambda command, folder: -9)
    assert cli.main(["pipeline_tiny", f"output_dir={tmp_path / 'p'}"]) == 2
    assert capsys.readouterr().err == (f"error: pipeline stage teacher_sft was killed by SIGKILL; run the same command "
                                       f"with output_dir={tmp_path / 'p'} to continue from this stage\n")


def test_the_steps_left_out_are_named_as_given(tmp_path, caplog, launched):
    with caplog.at_level("INFO", logger="rlt_mono.stages.pipeline"):
        assert cli.main(["pipeline_tiny", "steps=[teacher_rlt,teacher_sft]", f"output_dir={tmp_path / 'p'}"]) == 0
    assert launched == ["1_teacher_sft", "2_teacher_rlt"]
    assert "[3/6] distill: not in steps=[teacher_rlt,teacher_sft], left as it is" in caplog.messages
