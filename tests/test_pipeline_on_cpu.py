"""The pipeline stage: its wiring between stages, a whole run on the embedded tiny pair, and a continued run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlt_mono.config import ConfigError, compose
from rlt_mono.stages.pipeline import plan
from rlt_mono.stages.pipeline_steps import STEPS, STUDY_STEPS

ROOT = Path(__file__).resolve().parent.parent
# A stage's own overrides, from the command line: a Hydra list of quoted strings.
SMALL = ["pipeline.teacher_sft.overrides=['size=tiny','sft.max_steps=4']",
         "pipeline.teacher_rlt.overrides=['trainer.max_steps=2','trainer.save_steps=2',"
         "'trainer.max_completion_length=24']",
         "pipeline.distill.overrides=['size=tiny','data.max_rows=4']",
         "pipeline.student_sft.overrides=['size=tiny','sft.max_steps=2']",
         "pipeline.eval.overrides=['size=tiny','data.max_rows=3','eval.confidence=0.9','eval.bootstrap_resamples=300']"]


def test_each_stage_reads_the_output_of_the_one_before(tmp_path):
    steps = {p.stage: p for p in plan(compose("pipeline_tiny"), tmp_path)}
    assert list(steps) == list(STEPS)
    assert "model.model_name_or_path=1_teacher_sft/final" in steps["teacher_rlt"].overrides  # the folder's own
    assert "model.model_name_or_path=2_teacher_rlt/final" in steps["distill"].overrides
    assert "data.source=3_distill/distill.jsonl" in steps["student_sft"].overrides
    # the RL teacher is scored by the frozen student the reward used; the distilled student is evaluated alone
    assert not any(o.startswith("student.model_name_or_path") for o in steps["eval_teacher"].overrides)
    assert "student.model_name_or_path=4_student_sft/final" in steps["eval_student"].overrides
    assert "model.model_name_or_path=null" in steps["eval_student"].overrides
    assert [p.folder.name for p in steps.values()] == [f"{i}_{s}" for i, s in enumerate(STEPS, start=1)]
    with pytest.raises(ConfigError, match="pipeline.distill.config=eval runs stage 'eval', not 'distill'"):
        plan(compose("pipeline_tiny", ["pipeline.distill.config=eval"]), tmp_path)


def test_extra_overrides_follow_the_stage_own_and_reach_its_composed_config(tmp_path):
    extra = "+pipeline.distill.extra_overrides=['distill.selection=best_correct','data.max_rows=5']"
    steps = {p.stage: p for p in plan(compose("pipeline_tiny", [extra]), tmp_path)}
    own = [str(o) for o in compose("pipeline_tiny").pipeline.distill.overrides]
    overrides = list(steps["distill"].overrides)
    first_extra = overrides.index("distill.selection=best_correct")
    assert overrides[first_extra - len(own):first_extra] == own  # after the stage's own, in order
    assert overrides[first_extra + 1] == "data.max_rows=5"
    assert steps["distill"].settings["distill.selection"] == "best_correct"
    assert steps["distill"].settings["data.max_rows"] == 5
    assert "distill.selection=best_correct" not in steps["teacher_rlt"].overrides  # only the named stage


def _pipeline(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlt_mono.cli", "pipeline_tiny", f"output_dir={out}", "study=true",
                           *SMALL],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)


def test_the_whole_pipeline_and_its_study_run_on_the_tiny_pair_and_continue(tmp_path):
    out = tmp_path / "pipeline"
    result = _pipeline(out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "1_teacher_sft" / "sft_summary.json").read_text())["steps"] == 4
    assert (out / "2_teacher_rlt" / "final" / "config.json").is_file()
    distilled = [json.loads(line) for line in (out / "3_distill" / "distill.jsonl").read_text().splitlines()]
    assert len(distilled) == 4 and all({"explanation", "r_ss", "r_kl", "total"} <= set(r) for r in distilled)
    assert json.loads((out / "4_student_sft" / "sft_summary.json").read_text())["steps"] == 2
    teacher_eval = json.loads((out / "5_eval_teacher" / "eval.json").read_text())
    student_eval = json.loads((out / "6_eval_student" / "eval.json").read_text())
    assert teacher_eval["teacher"] == "2_teacher_rlt/final"  # relative to the pipeline folder
    assert teacher_eval["metrics"]["teacher/reward"]["n"] == 3
    assert student_eval["student"] == "4_student_sft/final" and student_eval["teacher"] is None
    assert "teacher/reward" not in student_eval["metrics"]
    table = (out / "eval_table.md").read_text()
    assert "| teacher/reward |" in table and "| student/accuracy |" in table
    # the columns are the step folders, so a copied or moved pipeline's table reads the same
    assert table.startswith("| | 5_eval_teacher | 6_eval_student |\n") and str(out) not in table, table
    summary = json.loads((out / "pipeline.json").read_text())["stages"]
    steps = [*STEPS, *STUDY_STEPS]
    assert list(summary) == steps and all(summary[s]["seconds"] > 0 for s in steps)
    # the study's controls: the raw-trace student trained on the RL distill rows' own traces, the same rows
    raw = json.loads((out / "9_student_sft_raw_traces" / "sft_summary.json").read_text())
    assert raw["explanation_column"] == "reasoning_trace" and raw["steps"] == 2
    assert all(r["reasoning_trace"] for r in distilled)
    sft_teacher = [json.loads(line) for line in (out / "7_distill_sft_teacher" / "distill.jsonl").open()]
    assert [r["question"] for r in sft_teacher] == [r["question"] for r in distilled]
    assert {r["teacher"] for r in sft_teacher} == {"1_teacher_sft/final"}
    study = json.loads((out / "study.json").read_text())
    assert study["teachers"]["teacher/reward"]["rl_minus_sft"]["n"] == 3
    # the study's intervals at the evaluations' confidence and resamples, as the pipeline's eval overrides set them
    assert (teacher_eval["confidence"], teacher_eval["bootstrap_resamples"], study["confidence"]) == (0.9, 300, 0.9)
    assert set(study["students"]) == {"base", "raw_traces", "sft_teacher", "rl_teacher"}
    assert "| student accuracy difference (paired) |" in (out / "study_table.md").read_text()

    again = _pipeline(out)  # done stages are skipped; distill finds every row written
    assert again.returncode == 0, again.stderr[-3000:]
    skipped = [line for line in again.stderr.splitlines() if "done already" in line]
    assert len(skipped) == len(steps) - 2  # the two distill steps always run (they skip rows written)
    # each finds its file whole and stops before any model loads
    assert again.stderr.count("distill: all 4 rows already written in ") == 2
    assert len((out / "3_distill" / "distill.jsonl").read_text().splitlines()) == 4


def test_steps_launches_only_the_named_steps(tmp_path, monkeypatch):
    import rlt_mono.stages.pipeline as pipeline

    launched = []

    def fake_run(command, folder):  # an eval step writes its eval.json, as the real stage does
        out = folder / next(a for a in command if a.startswith("output_dir=")).split("=", 1)[1]
        launched.append(out.name)
        out.mkdir(parents=True)
        (out / "eval.json").write_text(json.dumps({"teacher": None, "student": "s", "questions": 1, "metrics": {}}))
        return 0

    monkeypatch.setattr(pipeline, "run_stage", fake_run)
    root = tmp_path / "p"
    (root / "5_eval_teacher").mkdir(parents=True)
    (root / "5_eval_teacher" / "eval.json").write_text(json.dumps({"questions": 1, "metrics": {}}))
    pipeline.run_pipeline(compose("pipeline_tiny", [f"output_dir={root}", "steps=[eval_teacher,eval_student]"]))
    assert launched == ["6_eval_student"]  # eval_teacher was done already; nothing else was selected
    assert (root / "eval_table.md").is_file()
    with pytest.raises(ConfigError, match=r"^steps: eval_sft_teacher is a step of study=true: add study=true, or "
                                          r"leave it out of steps$"):
        pipeline.run_pipeline(compose("pipeline_tiny", [f"output_dir={root}", "steps=[eval_sft_teacher]"]))
    first = tmp_path / "first"  # the first steps alone: done, without the eval table the eval steps would write
    assert pipeline.run_pipeline(compose("pipeline_tiny", [f"output_dir={first}", "steps=[teacher_sft]"])) == first
    assert launched[-1] == "1_teacher_sft" and not (first / "eval_table.md").exists()
