"""The "Does it teach?" study: does RL make the teacher's explanations better than its SFT warm-up's?

A pipeline with ``study: true`` (``rlt_mono.pipeline``) evaluates, on the same held-out questions:

- two teachers, each writing one explanation per question, scored by the frozen student the RL reward used: the
  SFT-only teacher (``eval_sft_teacher``) and the RL teacher (``eval_teacher``);
- four students answering from the question alone (greedy): the untrained one (the student half of
  ``eval_teacher``) and the same student fine-tuned on the same rows with, as explanations, the data's raw
  reasoning traces, the SFT teacher's, or the RL teacher's.

``write_study`` puts every figure with its bootstrap interval and the paired differences between arms into
``study.json`` and ``study_table.md``. A paired difference is over the questions both arms answered: the mean of
the per-question differences, with a percentile-bootstrap interval from resampling those questions
(``paired_difference``), which is tighter than comparing two separate intervals when the arms' errors are
correlated across questions (the same hard questions are hard for both).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlt_mono.eval_results import EVAL_FILE, read_rows, summarize

STUDY_FILE = "study.json"
STUDY_TABLE_FILE = "study_table.md"
SFT_SUMMARY_FILE = "sft_summary.json"  # rlt_mono.sft.SUMMARY_FILE

# The teachers' figures: per-question field of eval_rows.jsonl -> the metric name of eval.json.
TEACHER_FIGURES = {
    "total": "teacher/reward",
    "r_ss": "teacher/r_ss",
    "r_kl": "teacher/r_kl",
    "unmatched": "teacher/unmatched_frac",
    "solution_log_prob": "student/solution_log_prob",
}
# arm -> (eval step whose student half it is, the student SFT step that trained it or None, what it trained on)
STUDENT_ARMS = {
    "base": ("eval_teacher", None, "nothing (the frozen student)"),
    "raw_traces": ("eval_student_raw_traces", "student_sft_raw_traces", "the data's reasoning traces"),
    "sft_teacher": ("eval_student_sft_teacher", "student_sft_sft_teacher", "the SFT teacher's explanations"),
    "rl_teacher": ("eval_student", "student_sft", "the RL teacher's explanations"),
}
STUDENT_PAIRS = (("rl_teacher", "sft_teacher"), ("rl_teacher", "raw_traces"), ("sft_teacher", "raw_traces"),
                 ("rl_teacher", "base"))


def paired_difference(rows_a: list[dict], rows_b: list[dict], field: str, confidence: float = 0.95,
                      resamples: int = 2000, seed: int = 0) -> dict:
    """Mean over shared questions of ``b[field] - a[field]`` with its bootstrap interval.

    Rows are matched by their ``question`` text; a question missing from either side, or whose value is None
    (e.g. an uncheckable answer), is left out. Booleans count as 0/1.
    """
    values_a = {r["question"]: r.get(field) for r in rows_a}
    differences = [float(r[field]) - float(values_a[r["question"]]) for r in rows_b
                   if r.get(field) is not None and values_a.get(r["question"]) is not None]
    return summarize(differences, confidence, resamples, seed)


def write_study(root: Path, folders: dict[str, Path], seed: int = 0, confidence: float = 0.95,
                resamples: int = 2000) -> str:
    """Write ``study.json`` and ``study_table.md`` into ``root`` from the study's step folders; returns the table."""
    # An arm whose eval has not run (yet) is reported as missing, not guessed: its cells read "—".
    steps = ("eval_sft_teacher", "eval_teacher", *(arm[0] for arm in STUDENT_ARMS.values()))
    evals = {step: json.loads((folders[step] / EVAL_FILE).read_text()) if (folders[step] / EVAL_FILE).is_file()
             else {"metrics": {}, "missing": True} for step in steps}
    rows = {step: [] if evals[step].get("missing") else read_rows(folders[step]) for step in steps}
    teachers = {
        metric: {
            "sft_teacher": evals["eval_sft_teacher"]["metrics"].get(metric),
            "rl_teacher": evals["eval_teacher"]["metrics"].get(metric),
            "rl_minus_sft": paired_difference(rows["eval_sft_teacher"], rows["eval_teacher"], field, confidence,
                                              resamples, seed),
        }
        for field, metric in TEACHER_FIGURES.items()
    }
    students = {}
    for arm, (eval_step, sft_step, trained_on) in STUDENT_ARMS.items():
        summary_path = folders[sft_step] / SFT_SUMMARY_FILE if sft_step is not None else None
        summary = json.loads(summary_path.read_text()) if summary_path and summary_path.is_file() else {}
        students[arm] = {
            "trained_on": trained_on,
            "accuracy": evals[eval_step]["metrics"].get("student/accuracy"),
            "sft_rows": summary.get("rows", {}).get("train"),
            "sft_steps": summary.get("steps"),
            "heldout_sft_loss_before": summary.get("heldout_loss_before"),
            "heldout_sft_loss_after": summary.get("heldout_loss_after"),
        }
    student_differences = {
        f"{b}_minus_{a}": paired_difference(rows[STUDENT_ARMS[a][0]], rows[STUDENT_ARMS[b][0]], "correct",
                                            confidence, resamples, seed)
        for b, a in STUDENT_PAIRS
    }
    study = {"questions": evals["eval_teacher"].get("questions"), "confidence": confidence, "seed": seed,
             "missing": [step for step in steps if evals[step].get("missing")],
             "teachers": teachers, "students": students, "student_differences": student_differences}
    (root / STUDY_FILE).write_text(json.dumps(study, indent=1) + "\n")
    table = study_table(study)
    (root / STUDY_TABLE_FILE).write_text(table + "\n")
    return table


def study_table(study: dict) -> str:
    """Markdown: the teachers side by side with their paired difference, then the students."""
    level = f"{study['confidence']:.0%}"
    missing = f" Not run: {', '.join(study['missing'])}." if study.get("missing") else ""
    lines = [f"Held-out questions: {study['questions']}; cells are mean [{level} bootstrap interval] (n).{missing}",
             "",
             "| teacher figure | SFT teacher | RL teacher | RL − SFT (paired) |", "| --- | --- | --- | --- |"]
    for metric, cells in study["teachers"].items():
        lines.append(f"| {metric} | {_cell(cells['sft_teacher'])} | {_cell(cells['rl_teacher'])} | "
                     f"{_cell(cells['rl_minus_sft'])} |")
    lines += ["", "| student trained on | SFT rows | SFT steps | held-out SFT loss before → after | accuracy |",
              "| --- | --- | --- | --- | --- |"]
    for arm in study["students"].values():
        loss = ("—" if arm["heldout_sft_loss_before"] is None
                else f"{arm['heldout_sft_loss_before']:.3f} → {arm['heldout_sft_loss_after']:.3f}")
        lines.append(f"| {arm['trained_on']} | {_or_dash(arm['sft_rows'])} | {_or_dash(arm['sft_steps'])} | {loss} | "
                     f"{_cell(arm['accuracy'])} |")
    lines += ["", "| student accuracy difference (paired) | mean [interval] (n) |", "| --- | --- |"]
    for name, cell in study["student_differences"].items():
        lines.append(f"| {name.replace('_minus_', ' − ')} | {_cell(cell)} |")
    return "\n".join(lines)


def _cell(metric: dict | None) -> str:
    if not metric or metric.get("mean") is None:
        return "—"
    return f"{metric['mean']:.3f} [{metric['low']:.3f}, {metric['high']:.3f}] ({metric['n']})"


def _or_dash(value) -> str:
    return "—" if value is None else str(value)
