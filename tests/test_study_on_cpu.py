"""The "Does it teach?" study's statistics and files: paired differences, and the table written from eval folders."""

import json
from pathlib import Path

import numpy as np
import pytest

from rlt_mono.config import compose
from rlt_mono.stages.pipeline import plan
from rlt_mono.stages.pipeline_steps import STEPS, STUDY_STEPS
from rlt_mono.study.aggregate import STUDY_FILE, STUDY_TABLE_FILE, paired_difference, write_study
from rlt_mono.study.eval_stats import summarize


def test_paired_difference_matches_questions_and_skips_missing_values():
    a = [{"question": "q1", "correct": True}, {"question": "q2", "correct": False},
         {"question": "q3", "correct": None}, {"question": "q4", "correct": True}]
    b = [{"question": "q4", "correct": True}, {"question": "q2", "correct": True},  # other order: matched by text
         {"question": "q1", "correct": False}, {"question": "q3", "correct": True},
         {"question": "q5", "correct": True}]  # q3: None on one side; q5: absent from a
    result = paired_difference(a, b, "correct", confidence=0.95, resamples=500, seed=0)
    # q4: 1-1=0, q2: 1-0=1, q1: 0-1=-1 -> mean 0 over 3 questions
    assert result["n"] == 3 and result["mean"] == pytest.approx(0.0)
    assert -1.0 <= result["low"] < 0.0 < result["high"] <= 1.0


def test_a_constant_difference_has_a_zero_width_interval():
    a = [{"question": f"q{i}", "total": float(i)} for i in range(10)]
    b = [{"question": f"q{i}", "total": float(i) + 0.5} for i in range(10)]
    assert paired_difference(a, b, "total", 0.95, 2000, 0) == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 10,
                                                               "too_few": True}
    assert summarize([], 0.95, 10, 0)["n"] == 0


def _eval_folder(folder: Path, rows: list[dict], metrics: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps({"questions": len(rows), "metrics": metrics}))
    (folder / "eval_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_write_study_reads_each_arm_and_writes_the_table(tmp_path):
    questions = [f"q{i}" for i in range(4)]
    folders = {step: tmp_path / step for step in (*STEPS, *STUDY_STEPS)}
    teacher_rows = {"eval_sft_teacher": [-8.0, -7.0, -6.0, -5.0], "eval_teacher": [-7.0, -6.5, -6.0, -4.0]}
    for step, totals in teacher_rows.items():
        rows = [{"question": q, "total": t, "r_ss": t, "r_kl": 0.0, "unmatched": False, "solution_log_prob": -1.0,
                 "correct": i == 0} for i, (q, t) in enumerate(zip(questions, totals))]
        _eval_folder(folders[step], rows, {"teacher/reward": {"mean": float(np.mean(totals)), "low": -9.0,
                                                              "high": 0.0, "n": 4},
                                           "student/accuracy": {"mean": 0.25, "low": 0, "high": 1, "n": 4}})
    correct = {"eval_student": [1, 1, 1, 0], "eval_student_sft_teacher": [1, 1, 0, 0],
               "eval_student_raw_traces": [1, 0, 0, 0]}
    for step, flags in correct.items():
        rows = [{"question": q, "correct": bool(c)} for q, c in zip(questions, flags)]
        _eval_folder(folders[step], rows, {"student/accuracy": {"mean": float(np.mean(flags)), "low": 0.0,
                                                                "high": 1.0, "n": 4}})
    for step, rows_trained in (("student_sft", 30), ("student_sft_sft_teacher", 29), ("student_sft_raw_traces", 31)):
        folders[step].mkdir(parents=True)
        (folders[step] / "sft_summary.json").write_text(json.dumps(
            {"rows": {"train": rows_trained}, "steps": 8, "heldout_loss_before": 1.5, "heldout_loss_after": 0.5}))

    table = write_study(tmp_path, folders, seed=0, confidence=0.95, resamples=200)
    study = json.loads((tmp_path / STUDY_FILE).read_text())
    assert (tmp_path / STUDY_TABLE_FILE).read_text() == table + "\n"
    # RL - SFT teacher reward per question: 1, 0.5, 0, 1 -> 0.625
    assert study["teachers"]["teacher/reward"]["rl_minus_sft"]["mean"] == pytest.approx(0.625)
    assert study["teachers"]["teacher/reward"]["sft_teacher"]["mean"] == pytest.approx(-6.5)
    diffs = study["student_differences"]
    assert diffs["rl_teacher_minus_sft_teacher"]["mean"] == pytest.approx(0.25)
    assert diffs["rl_teacher_minus_raw_traces"]["mean"] == pytest.approx(0.5)
    assert diffs["rl_teacher_minus_base"]["mean"] == pytest.approx(0.5)  # base: the student half of eval_teacher
    assert study["students"]["sft_teacher"]["sft_rows"] == 29 and study["students"]["base"]["sft_steps"] is None
    assert "| the RL teacher's explanations | 30 | 8 | 1.500 → 0.500 | 0.750 [0.000, 1.000] (4) |" in table
    assert "| teacher/reward | -6.500 [-9.000, 0.000] (4) | -5.875 [-9.000, 0.000] (4) | 0.625 [" in table


def test_a_study_pipeline_wires_each_control_to_its_source(tmp_path):
    steps = {p.stage: p for p in plan(compose("pipeline_tiny", ["study=true"]), tmp_path)}
    assert list(steps) == [*STEPS, *STUDY_STEPS]
    assert [p.folder.name for p in steps.values()][-1] == "12_eval_student_raw_traces"
    sft_final = "model.model_name_or_path=1_teacher_sft/final"
    assert sft_final in steps["distill_sft_teacher"].overrides and sft_final in steps["eval_sft_teacher"].overrides
    assert "data.source=7_distill_sft_teacher/distill.jsonl" in steps["student_sft_sft_teacher"].overrides
    # the SFT teacher's distilled rows (the same questions), their own traces
    raw = steps["student_sft_raw_traces"].overrides
    assert "data.source=7_distill_sft_teacher/distill.jsonl" in raw
    assert "sft.explanation_column=reasoning_trace" in raw
    assert ("student.model_name_or_path=9_student_sft_raw_traces/final"
            in steps["eval_student_raw_traces"].overrides)
    assert steps["student_sft_raw_traces"].config == "student_sft"  # the student_sft stage's run config


def test_an_answer_in_the_models_own_boxed_format_counts_and_rescore_rewrites_the_figure(tmp_path):
    from rlt_mono.stages.eval import check_answer, main

    row = {"question": "q", "solution": "The answer is 51.", "answer": "51"}
    # Qwen2.5-Coder-0.5B-Instruct's own answer to a held-out question (GPU eval, 2026-11-22), shortened
    qwen = "3. **New Trees Planted:** \\(39 + 12 = 51\\) trees now.\n\nSo the number is \\(\\boxed{51}\\)."
    assert check_answer(row, qwen) == (True, True)
    assert check_answer(row, "\\boxed{50}") == (False, True)
    assert check_answer(row, "The answer is 51. Check: \\boxed{3}") == (True, True)  # the stated format wins
    assert check_answer(row, "no number at all") == (False, False)  # wrong, and counted as unparsed
    assert check_answer(row, "The answer is 51.0") == (True, True)  # math-verify compares values, not strings
    assert check_answer({**row, "answer": "1234"}, "so \\boxed{1,234}") == (True, True)  # a thousands comma
    assert check_answer({**row, "answer": "3.5"}, "The answer is 3.5.\nThen 7.") == (True, True)
    assert check_answer({"question": "q", "solution": "The answer is 7."}, "The answer is 7") == (True, True)
    assert check_answer({"question": "q", "solution": "no stated answer"}, "The answer is 7") == (None, True)
    # a colon and a line break before the stated answer (the 1.5B's plain-prompt answers, 2026-11-30): its first box
    assert check_answer({**row, "answer": "425"}, "The answer is:\n\\[\n\\boxed{425}\n\\]") == (True, True)
    assert check_answer(row, "The answer is:\n\\boxed{51}. Check: \\boxed{3}") == (True, True)
    assert check_answer(row, "The answer is:\n\\boxed{\\frac{102}{2}}") == (True, True)  # braces inside matched
    # ... and nothing else that follows: working after the words is not the answer
    assert check_answer(row, "The answer is:\n\nFirst, 3+48=51. So the total is 9.") == (False, False)
    assert check_answer(row, "The answer is:\n\\boxed{51") == (False, False)  # a box never closed
    assert check_answer(row, "The answer is: 51.") == (True, True)
    assert check_answer(row, "The answer is\n51") == (True, True)

    folder = tmp_path / "6_eval_student"
    rows = [{**row, "question": "a", "student_output": qwen, "correct": False},
            {**row, "question": "b", "student_output": "The answer is 7.", "correct": False},
            {"question": "c", "solution": "x", "student_output": "y", "correct": None}]
    _eval_folder(folder, rows, {"student/accuracy": {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 2}})
    eval_json = json.loads((folder / "eval.json").read_text())
    (folder / "eval.json").write_text(json.dumps({**eval_json, "confidence": 0.95, "seed": 0}))
    assert main(["rescore", str(folder)]) == 0
    result = json.loads((folder / "eval.json").read_text())
    assert result["rescored"] is True and result["metrics"]["student/accuracy"]["mean"] == 0.5
    assert result["metrics"]["student/accuracy"]["n"] == 2  # the uncheckable row stays out
    assert result["metrics"]["student/unparsed_frac"] == {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 2, "too_few": True}
    assert [json.loads(line)["correct"] for line in (folder / "eval_rows.jsonl").open()] == [True, False, None]


def test_an_arm_that_has_not_run_reads_as_missing(tmp_path):
    folders = {step: tmp_path / step for step in (*STEPS, *STUDY_STEPS)}
    rows = [{"question": "q", "total": -8.0, "correct": True}]
    _eval_folder(folders["eval_teacher"], rows, {"teacher/reward": {"mean": -8.0, "low": -8.0, "high": -8.0, "n": 1}})
    _eval_folder(folders["eval_student"], rows, {"student/accuracy": {"mean": 1.0, "low": 1.0, "high": 1.0, "n": 1}})
    table = write_study(tmp_path, folders, seed=0, confidence=0.95, resamples=10)
    study = json.loads((tmp_path / STUDY_FILE).read_text())
    assert study["missing"] == ["eval_sft_teacher", "eval_student_raw_traces", "eval_student_sft_teacher"]
    assert study["teachers"]["teacher/reward"]["rl_minus_sft"]["n"] == 0
    assert "Not run: eval_sft_teacher, eval_student_raw_traces, eval_student_sft_teacher." in table
    assert "| teacher/reward | — | -8.000 [-8.000, -8.000] (1) | — |" in table
