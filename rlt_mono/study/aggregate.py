"""The "Does it teach?" study: does RL make the teacher's explanations better than its SFT warm-up's?

A pipeline with ``study: true`` (``rlt_mono.stages.pipeline``) evaluates, on the same held-out questions:

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

``aggregate`` does the study over seeds, one study pipeline folder per seed (its numbered step folders as
``rlt_mono.stages.pipeline`` names them, ``step_folders``): each held-out set (templates, instances) apart, a question's
figure is first averaged over the seeds that answered it, then the figure is the mean over questions with a
bootstrap interval over questions, beside each seed's own figure and their spread; paired differences average each
question's difference over seeds. It also correlates each teacher's reward with its student's accuracy, sums up the
RL runs (tied groups, held-out reward curve) and the teacher SFT, and writes ``study.json``, ``study_table.md`` and
three plots (``rlt_mono.runs.plots``). A step that did not run is reported as missing, never filled in:

    python -m rlt_mono.study aggregate <root>/seed0 <root>/seed1 <root>/seed2 --out <root>/aggregate \
        --command "bash bench/study_gsm.sh <root> 0,1,2" --device "one H200"
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlt_mono.errors import UserError
from rlt_mono.runs.atomic_write import write_json, write_text
from rlt_mono.runs.outputs import CONFIG_FILE, EVAL_EVENT, METRICS_FILE, is_number, read_metrics
from rlt_mono.runs.plots import plot_arms_accuracy, plot_heldout_reward_by_seed, plot_tied_groups_by_seed
from rlt_mono.stages.pipeline_steps import STEP_FOLDER_NAMES
from rlt_mono.study.eval_stats import (
    CONFIDENCE,
    EVAL_FILE,
    RESAMPLES,
    ROWS_FILE,
    interval_text,
    read_rows,
    summarize,
)

logger = logging.getLogger(__name__)

STUDY_FILE = "study.json"
STUDY_TABLE_FILE = "study_table.md"
SFT_SUMMARY_FILE = "sft_summary.json"  # rlt_mono.stages.sft.SUMMARY_FILE

# The teachers' figures: per-question field of eval_rows.jsonl -> the metric name of eval.json.
TEACHER_FIGURES = {
    "total": "teacher/reward",
    "r_ss": "teacher/r_ss",
    "r_kl": "teacher/r_kl",
    "unmatched": "teacher/unmatched_frac",
    "solution_log_prob": "student/solution_log_prob",
}
# The steps the study reads by name: the pipeline's steps (STEP_FOLDER_NAMES), of which a few are named as the stage
# they run. A step is no stage (a study runs student_sft and eval several times, each its own step and folder, and a
# step that did not run has no config to read a stage from), so the study's folder layout names them, not the stages.
TEACHER_SFT_STEP = "teacher_sft"
RL_STEP = "teacher_rlt"
# arm -> (eval step whose student half it is, the student SFT step that trained it or None, what it trained on)
STUDENT_ARMS = {
    "base": ("eval_teacher", None, "nothing (the frozen student)"),
    "raw_traces": ("eval_student_raw_traces", "student_sft_raw_traces", "the data's reasoning traces"),
    "sft_teacher": ("eval_student_sft_teacher", "student_sft_sft_teacher", "the SFT teacher's explanations"),
    "rl_teacher": ("eval_student", "student_sft", "the RL teacher's explanations"),
}
STUDENT_PAIRS = (("rl_teacher", "sft_teacher"), ("rl_teacher", "raw_traces"), ("sft_teacher", "raw_traces"),
                 ("rl_teacher", "base"))


def paired_difference(rows_a: list[dict], rows_b: list[dict], field: str, confidence: float, resamples: int,
                      seed: int) -> dict:
    """Mean over shared questions of ``b[field] - a[field]`` with its bootstrap interval.

    Rows are matched by their ``question`` text; a question missing from either side, or whose value is None
    (e.g. an uncheckable answer), is left out. Booleans count as 0/1.
    """
    values_a = question_values(rows_a, field)
    differences = [value - values_a[question] for question, value in question_values(rows_b, field).items()
                   if question in values_a]
    return summarize(differences, confidence, resamples, seed)


def question_values(rows: list[dict], field: str, held_out: str | None = None) -> dict[str, float]:
    """``{question: float(row[field])}`` of one eval's rows (of one held-out set when ``held_out`` is given), in
    row order; rows whose value is None (e.g. an uncheckable answer) are left out. Booleans count as 0/1."""
    return {r["question"]: float(r[field]) for r in rows
            if r.get(field) is not None and (held_out is None or r.get("heldout") == held_out)}


def write_study(root: Path, folders: dict[str, Path], *, seed: int, confidence: float, resamples: int) -> str:
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
    write_json(root / STUDY_FILE, study)
    table = study_table(study)
    write_text(root / STUDY_TABLE_FILE, table + "\n")
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
    return f"{metric['mean']:.3f} {interval_text(metric)} ({metric['n']})"


def _or_dash(value) -> str:
    return "—" if value is None else str(value)


# ---- the study over seeds -------------------------------------------------------------------------------------
# Each seed is one study pipeline folder; the held-out questions are the same in every seed, so a question's
# figure is averaged over the seeds that answered it first, and the bootstrap resamples questions.
AGGREGATE_FILES = {"rl_heldout_reward": "rl_heldout_reward.png", "rl_tied_groups": "rl_tied_groups.png",
                   "arms_accuracy": "arms_accuracy.png"}
# An eval row's "heldout": instances of the training templates, or whole templates no stage trains on
# (rlt_mono.data.rows's gsm_symbolic split).
HELD_OUT_SETS = ("templates", "instances")
# teacher -> the eval step that scored it with the frozen student.
TEACHER_EVALS = {"sft_teacher": "eval_sft_teacher", "rl_teacher": "eval_teacher"}
# A teacher's figure in study.json -> its per-question field of eval_rows.jsonl.
TEACHER_FIELDS = {"reward": "total", "r_ss": "r_ss", "r_kl": "r_kl"}
# Steps of a tied-group fraction's rolling mean in rl_tied_groups.png.
TIED_WINDOW = 10
CORRELATION_NOTE = (
    "Pearson r over (seed, teacher, held-out set) points: a teacher's mean held-out reward against the held-out "
    "accuracy of the student trained on its explanations (sft_teacher -> arm sft_teacher, rl_teacher -> arm "
    "rl_teacher). The points are few and not independent (both held-out sets share each teacher): descriptive "
    "only; null with fewer than 3 points or a constant side.")



def step_folders(root: Path) -> dict[str, Path]:
    """Each step's folder in the pipeline folder ``root`` (``STEP_FOLDER_NAMES``)."""
    return {step: root / name for step, name in STEP_FOLDER_NAMES.items()}


@dataclass(frozen=True)
class SeedRun:
    """What one seed's pipeline folder holds; None wherever a step's files are missing (it did not run)."""

    seed: int
    folder: Path
    # eval step -> its eval_rows.jsonl rows (None without both eval.json and eval_rows.jsonl)
    eval_rows: dict[str, list[dict] | None]
    # 2_teacher_rlt/metrics.jsonl: its step rows and its held-out evaluation rows
    rl_steps: list[dict] | None
    rl_evals: list[dict] | None
    # 1_teacher_sft/sft_summary.json, and that folder with links resolved (seeds may share one teacher SFT)
    teacher_sft: dict | None
    teacher_sft_folder: Path


def seed_of(folder: Path) -> int:
    """A pipeline folder's seed: ``seed`` of its ``config.yaml`` when present, else the N of a ``seed<N>`` or
    ``seed<N>-<anything>`` name."""
    config = folder / CONFIG_FILE
    if config.is_file():
        try:
            seed = OmegaConf.load(config).get("seed")
        except (OSError, OmegaConfBaseException) as err:
            raise UserError(f"{config}: unreadable ({err})") from err
        if seed is not None:
            return int(seed)
    if match := re.fullmatch(r"seed(\d+)(?:-.+)?", folder.name):  # seed3, or seed3-best_correct (bench/study_gsm.sh)
        return int(match.group(1))
    raise UserError(f"{folder}: no seed in {CONFIG_FILE} and the folder is not named seed<N>")


def read_seed(folder: Path) -> SeedRun:
    """Read one seed's study pipeline folder (``step_folders``); a step that did not run reads as None."""
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder (give each seed's study pipeline folder)")
    folders = step_folders(folder)
    evals = (*TEACHER_EVALS.values(), *(arm[0] for arm in STUDENT_ARMS.values()))
    eval_rows = {step: read_rows(folders[step])
                 if (folders[step] / EVAL_FILE).is_file() and (folders[step] / ROWS_FILE).is_file() else None
                 for step in dict.fromkeys(evals)}
    metrics = folders[RL_STEP] / METRICS_FILE
    summary = folders[TEACHER_SFT_STEP] / SFT_SUMMARY_FILE
    return SeedRun(seed=seed_of(folder), folder=folder, eval_rows=eval_rows,
                   rl_steps=read_metrics(metrics) if metrics.is_file() else None,
                   rl_evals=read_metrics(metrics, EVAL_EVENT) if metrics.is_file() else None,
                   teacher_sft=json.loads(summary.read_text()) if summary.is_file() else None,
                   teacher_sft_folder=folders[TEACHER_SFT_STEP].resolve())


def pooled_over_seeds(values_by_seed: dict[int, dict[str, float]], resamples: int = RESAMPLES,
                      seed: int = 0) -> dict | None:
    """One figure over seeds from each seed's ``{question: value}`` (``question_values``): ``mean`` over questions
    of each question's value averaged over the seeds that have it, ``ci95`` its percentile-bootstrap interval over
    questions, ``per_seed`` each seed's own mean, ``seed_spread`` min/max/population std of those, ``questions``.
    None when no seed has a value. ``seed`` seeds the bootstrap."""
    values_by_seed = {s: values for s, values in values_by_seed.items() if values}
    if not values_by_seed:
        return None
    means = question_means(values_by_seed)
    summary = summarize(list(means.values()), CONFIDENCE, resamples, seed)
    per_seed = {s: float(np.mean(list(values.values()))) for s, values in sorted(values_by_seed.items())}
    spread = list(per_seed.values())
    return {"mean": summary["mean"], "ci95": [summary["low"], summary["high"]], "per_seed": per_seed,
            "seed_spread": {"min": min(spread), "max": max(spread), "std": float(np.std(spread))},
            "questions": len(means)}


def question_means(values_by_seed: dict[int, dict[str, float]]) -> dict[str, float]:
    """``{question: its value averaged over the seeds that have it}``, questions sorted."""
    questions = sorted({question for values in values_by_seed.values() for question in values})
    return {q: float(np.mean([values[q] for values in values_by_seed.values() if q in values])) for q in questions}


def paired_over_seeds(pairs: dict[int, tuple[dict[str, float], dict[str, float]]], resamples: int = RESAMPLES,
                      seed: int = 0) -> dict | None:
    """``b - a`` from each seed's ``(a, b)`` per-question values: per question the mean over seeds of ``b - a``
    (seeds where both sides have it), then ``mean``, ``ci95`` (bootstrap over questions), ``per_seed`` (each
    seed's mean difference) and ``questions``, as ``pooled_over_seeds`` gives them. None when no question is
    shared."""
    differences = {s: {q: value - a[q] for q, value in b.items() if q in a} for s, (a, b) in pairs.items()}
    pooled = pooled_over_seeds(differences, resamples, seed)
    return None if pooled is None else {key: pooled[key] for key in ("mean", "ci95", "per_seed", "questions")}


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r of paired values; None with fewer than 3 pairs or when either side is constant."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)  # (n,), (n,)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def _ran(runs: list[SeedRun], step: str) -> dict:
    """The seeds whose ``step`` eval ran, those where it is missing, and whether it is missing in every seed."""
    ran = [run.seed for run in runs if run.eval_rows[step] is not None]
    return {"seeds": ran, "missing_seeds": [run.seed for run in runs if run.eval_rows[step] is None],
            "missing": not ran}


def values_by_seed(runs: list[SeedRun], step: str, field: str, held_out: str) -> dict[int, dict[str, float]]:
    """``{seed: question_values}`` of ``step``'s rows of one held-out set, for each seed whose ``step`` ran."""
    return {run.seed: question_values(run.eval_rows[step], field, held_out) for run in runs
            if run.eval_rows[step] is not None}


def _curve(rows: list[dict], key: str) -> list[list[float]]:
    return [[row["step"], float(row[key])] for row in rows if is_number(row.get(key))]


def _mean_of(curve: list[list[float]]) -> float | None:
    return float(np.mean([value for _, value in curve])) if curve else None


def rl_summary(run: SeedRun) -> dict:
    """One seed's RL run from ``metrics.jsonl``: its last step, the mean tied-group fractions (before and after the
    refill; TRL's ``frac_reward_zero_std`` when logged) and the curves behind them, and the held-out reward curve.
    ``{"missing": True}`` without the file."""
    if run.rl_steps is None:
        return {"missing": True}
    tied, refilled = _curve(run.rl_steps, "groups/tied_frac"), _curve(run.rl_steps, "groups/tied_frac_after_refill")
    return {"steps": max((row["step"] for row in run.rl_steps), default=None),
            "tied_frac_mean": _mean_of(tied), "tied_frac_after_refill_mean": _mean_of(refilled),
            "frac_reward_zero_std_mean": _mean_of(_curve(run.rl_steps, "frac_reward_zero_std")),
            "eval_reward_curve": _curve(run.rl_evals, "eval_reward"),
            "tied_frac_curve": tied, "tied_frac_after_refill_curve": refilled}


def teacher_sft_summary(runs: list[SeedRun]) -> dict:
    """The teacher SFT the seeds start from (``sft_summary.json``): its steps, held-out curve, diversity and early
    stopping, with the seeds that share its folder; a further teacher SFT (seeds with folders of their own) is
    listed under ``other_runs`` the same way. ``{"missing": True}`` when no seed has one."""
    by_folder: dict[Path, list[SeedRun]] = {}
    for run in runs:
        if run.teacher_sft is not None:
            by_folder.setdefault(run.teacher_sft_folder, []).append(run)
    entries = [{"folder": str(folder), "seeds": [run.seed for run in sharing],
                **{key: sharing[0].teacher_sft.get(key) for key in ("steps", "heldout_curve", "diversity",
                                                                     "early_stopping")}}
               for folder, sharing in by_folder.items()]
    if not entries:
        return {"missing": True}
    return {**entries[0], **({"other_runs": entries[1:]} if entries[1:] else {})}


def arm_entry(runs: list[SeedRun], name: str, resamples: int, seed: int) -> dict:
    """A student arm over seeds: per held-out set its accuracy (``pooled_over_seeds``) and unparsed fraction; an
    arm no seed ran is ``missing`` with its sets None."""
    step, _, trained_on = STUDENT_ARMS[name]
    arm = {"name": name, "trained_on": trained_on, "eval_step": STEP_FOLDER_NAMES[step], **_ran(runs, step)}
    for held_out in HELD_OUT_SETS:
        accuracy = pooled_over_seeds(values_by_seed(runs, step, "correct", held_out), resamples, seed)
        unparsed = pooled_over_seeds(values_by_seed(runs, step, "unparsed", held_out), resamples, seed)
        arm[f"held_out_{held_out}"] = None if accuracy is None else {
            "accuracy": accuracy["mean"], "ci95": accuracy["ci95"], "per_seed": accuracy["per_seed"],
            "seed_spread": accuracy["seed_spread"], "unparsed_frac": None if unparsed is None else unparsed["mean"],
            "questions": accuracy["questions"]}
    return arm


def teacher_entry(runs: list[SeedRun], name: str, resamples: int, seed: int) -> dict:
    """A teacher over seeds: per held-out set its reward, r_ss and r_kl (``pooled_over_seeds``)."""
    step = TEACHER_EVALS[name]
    teacher = {"name": name, "eval_step": STEP_FOLDER_NAMES[step], **_ran(runs, step)}
    for held_out in HELD_OUT_SETS:
        figures = {figure: pooled_over_seeds(values_by_seed(runs, step, field, held_out), resamples, seed)
                   for figure, field in TEACHER_FIELDS.items()}
        teacher[f"held_out_{held_out}"] = figures if figures["reward"] is not None else None
    return teacher


def arm_differences(runs: list[SeedRun], held_out: str, resamples: int, seed: int) -> dict:
    """``<b>_minus_<a>`` for each pair of ``STUDENT_PAIRS``: the paired accuracy difference over the seeds where
    both arms ran (``paired_over_seeds``); None where no seed ran both."""
    differences = {}
    for b, a in STUDENT_PAIRS:
        step_a, step_b = STUDENT_ARMS[a][0], STUDENT_ARMS[b][0]
        pairs = {run.seed: (question_values(run.eval_rows[step_a], "correct", held_out),
                            question_values(run.eval_rows[step_b], "correct", held_out))
                 for run in runs if run.eval_rows[step_a] is not None and run.eval_rows[step_b] is not None}
        differences[f"{b}_minus_{a}"] = paired_over_seeds(pairs, resamples, seed)
    return differences


def reward_accuracy_correlation(teachers: list[dict], arms: list[dict]) -> dict:
    """Pearson r between each (seed, teacher, held-out set)'s teacher reward and the accuracy of the arm of the
    same name (the student trained on that teacher's explanations), with its points (``CORRELATION_NOTE``)."""
    arm_of = {arm["name"]: arm for arm in arms}
    points = []
    for teacher in teachers:
        for held_out in HELD_OUT_SETS:
            rewards, student = teacher[f"held_out_{held_out}"], arm_of[teacher["name"]][f"held_out_{held_out}"]
            if rewards is None or student is None:
                continue
            points += [{"seed": s, "teacher": teacher["name"], "held_out": held_out, "teacher_reward": reward,
                        "student_accuracy": student["per_seed"][s]}
                       for s, reward in rewards["reward"]["per_seed"].items() if s in student["per_seed"]]
    return {"pearson": pearson([p["teacher_reward"] for p in points], [p["student_accuracy"] for p in points]),
            "points": points, "note": CORRELATION_NOTE}


def missing_files(run: SeedRun) -> list[str]:
    """What a seed's folder lacks, as paths inside it: eval folders that did not run, the RL metrics, the teacher
    SFT summary."""
    rl_folder, sft_folder = STEP_FOLDER_NAMES[RL_STEP], STEP_FOLDER_NAMES[TEACHER_SFT_STEP]
    return ([STEP_FOLDER_NAMES[step] for step, rows in run.eval_rows.items() if rows is None]
            + ([f"{rl_folder}/{METRICS_FILE}"] if run.rl_steps is None else [])
            + ([f"{sft_folder}/{SFT_SUMMARY_FILE}"] if run.teacher_sft is None else []))


def aggregate_study(runs: list[SeedRun], commands: Sequence[str], device: str | None, resamples: int = RESAMPLES,
                    seed: int = 0) -> dict:
    """The study over seeds as ``study.json`` holds it (``aggregate`` writes it): arms, teachers, paired
    differences between arms, the teacher-reward/student-accuracy correlation, the RL runs and the teacher SFT.
    ``seed`` seeds the bootstrap."""
    arms = [arm_entry(runs, name, resamples, seed) for name in STUDENT_ARMS]
    teachers = [teacher_entry(runs, name, resamples, seed) for name in TEACHER_EVALS]
    return {"seeds": [run.seed for run in runs], "folders": {run.seed: str(run.folder) for run in runs},
            "confidence": CONFIDENCE, "bootstrap": {"resamples": resamples, "seed": seed},
            "missing": {run.seed: missing_files(run) for run in runs},
            "arms": arms, "teachers": teachers,
            "differences": {f"held_out_{held_out}": arm_differences(runs, held_out, resamples, seed)
                            for held_out in HELD_OUT_SETS},
            "correlation": reward_accuracy_correlation(teachers, arms),
            "rl": {run.seed: rl_summary(run) for run in runs}, "teacher_sft": teacher_sft_summary(runs),
            "commands": list(commands), "device": device}


def aggregate(seed_folders: Sequence[Path], out: Path, commands: Sequence[str] = (), device: str | None = None,
              resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """The study over seeds: read each seed's pipeline folder (``read_seed``), write ``study.json``,
    ``study_table.md`` and the plots (``AGGREGATE_FILES``) into ``out``, log the table; returns the study."""
    runs = [read_seed(Path(folder)) for folder in seed_folders]
    seeds = [run.seed for run in runs]
    if len(set(seeds)) != len(seeds):
        raise UserError(f"seeds {seeds} of {[str(f) for f in seed_folders]}: each folder must be another seed")
    for run in runs:
        if missing := missing_files(run):
            logger.warning("seed %d (%s): missing %s", run.seed, run.folder, ", ".join(missing))
        untagged = [STEP_FOLDER_NAMES[step] for step, rows in run.eval_rows.items()
                    if rows and not any(row.get("heldout") in HELD_OUT_SETS for row in rows)]
        if untagged:  # e.g. a dataset without held-out sets: the study has nothing of these evals to report
            logger.warning("seed %d: %s ran, but none of its rows is in a held-out set %s", run.seed,
                           ", ".join(untagged), HELD_OUT_SETS)
    study = aggregate_study(runs, list(commands), device, resamples, seed)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / STUDY_FILE, study)
    table = aggregate_table(study)
    write_text(out / STUDY_TABLE_FILE, table + "\n")
    rl = {s: entry for s, entry in study["rl"].items() if not entry.get("missing")}
    plot_heldout_reward_by_seed({s: entry["eval_reward_curve"] for s, entry in rl.items()},
                                out / AGGREGATE_FILES["rl_heldout_reward"])
    plot_tied_groups_by_seed({s: entry["tied_frac_curve"] for s, entry in rl.items()},
                             {s: entry["tied_frac_after_refill_curve"] for s, entry in rl.items()},
                             out / AGGREGATE_FILES["rl_tied_groups"], TIED_WINDOW)
    plot_arms_accuracy({arm["name"]: {held_out: _bar(arm[f"held_out_{held_out}"]) for held_out in HELD_OUT_SETS}
                        for arm in study["arms"]}, out / AGGREGATE_FILES["arms_accuracy"])
    logger.info("study over seeds %s in %s:\n%s", seeds, out, table)
    return study


def _bar(figure: dict | None) -> tuple[float, float, float] | None:
    if figure is None:
        return None
    accuracy, (low, high) = figure["accuracy"], figure["ci95"]  # None from one question: no error bar
    return (accuracy, accuracy, accuracy) if low is None else (accuracy, low, high)


def aggregate_table(study: dict) -> str:
    """Markdown of ``aggregate_study``'s study: per held-out set the student arms, then the teachers, the paired
    differences, the correlation, the RL runs' tied groups, what is missing, and the commands."""
    level = f"{study['confidence']:.0%}"
    lines = [f"Seeds {', '.join(map(str, study['seeds']))}; a figure is the mean over held-out questions of each "
             f"question's value averaged over the seeds that ran, with its {level} percentile-bootstrap interval "
             f"over questions ({study['bootstrap']['resamples']} resamples); — : not run."]
    for held_out in HELD_OUT_SETS:
        key = f"held_out_{held_out}"
        lines += ["", f"Students on held-out {held_out}:", "",
                  f"| arm | trained on | accuracy [{level} CI] | per seed | unparsed | questions |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for arm in study["arms"]:
            figure = arm[key]
            if figure is None:
                lines.append(f"| {arm['name']} | {arm['trained_on']} | — | — | — | — |")
                continue
            lines.append(f"| {arm['name']} | {arm['trained_on']} | {_interval(figure['accuracy'], figure['ci95'])} | "
                         f"{_per_seed(figure['per_seed'])} | {_number(figure['unparsed_frac'])} | "
                         f"{figure['questions']} |")
    lines += ["", "Teachers scored by the frozen student:", "",
              f"| teacher | held-out set | reward [{level} CI] | per seed | r_ss | r_kl | questions |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for teacher in study["teachers"]:
        for held_out in HELD_OUT_SETS:
            figures = teacher[f"held_out_{held_out}"]
            if figures is None:
                lines.append(f"| {teacher['name']} | {held_out} | — | — | — | — | — |")
                continue
            reward = figures["reward"]
            lines.append(f"| {teacher['name']} | {held_out} | {_interval(reward['mean'], reward['ci95'])} | "
                         f"{_per_seed(reward['per_seed'])} | {_figure(figures['r_ss'])} | {_figure(figures['r_kl'])} "
                         f"| {reward['questions']} |")
    lines += ["", "Student accuracy differences, paired over questions (b − a per question, averaged over seeds):",
              "", f"| held-out set | difference | mean [{level} CI] | per seed | questions |",
              "| --- | --- | --- | --- | --- |"]
    for key, differences in study["differences"].items():
        for name, difference in differences.items():
            cells = ("— | — | —" if difference is None else
                     f"{_interval(difference['mean'], difference['ci95'])} | {_per_seed(difference['per_seed'])} | "
                     f"{difference['questions']}")
            lines.append(f"| {key.removeprefix('held_out_')} | {name.replace('_minus_', ' − ')} | {cells} |")
    correlation = study["correlation"]
    lines += ["", f"Teacher reward vs its student's accuracy: Pearson r = {_number(correlation['pearson'])} over "
                  f"{len(correlation['points'])} points. {correlation['note']}",
              "", "| seed | RL steps | tied groups (mean) | after refill (mean) | last held-out reward |",
              "| --- | --- | --- | --- | --- |"]
    for s, rl in study["rl"].items():
        if rl.get("missing"):
            lines.append(f"| {s} | — | — | — | — |")
            continue
        last = rl["eval_reward_curve"][-1][1] if rl["eval_reward_curve"] else None
        lines.append(f"| {s} | {_or_dash(rl['steps'])} | {_number(rl['tied_frac_mean'])} | "
                     f"{_number(rl['tied_frac_after_refill_mean'])} | {_number(last)} |")
    missing = [f"seed {s}: {', '.join(files)}" for s, files in study["missing"].items() if files]
    if missing:
        lines += ["", "Not run: " + "; ".join(missing) + "."]
    if study["commands"] or study["device"]:
        lines += ["", f"Device: {_or_dash(study['device'])}. Commands:", *(f"    {c}" for c in study["commands"])]
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _interval(mean: float, ci95: list[float | None]) -> str:
    return f"{mean:.3f} {interval_text({'low': ci95[0], 'high': ci95[1]})}"


def _figure(figure: dict | None) -> str:
    return "—" if figure is None else _interval(figure["mean"], figure["ci95"])


def _per_seed(per_seed: dict) -> str:
    return ", ".join(f"{s}: {value:.3f}" for s, value in per_seed.items())


def main(argv: list[str] | None = None) -> int:
    """``python -m rlt_mono.study aggregate <seed folder> ... --out <dir> [--command "..."]... [--device "..."]``:
    the study over seeds into ``<dir>`` (``aggregate``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlt_mono.study", description=__doc__.splitlines()[0])
    actions = parser.add_subparsers(dest="action", required=True)
    over_seeds = actions.add_parser("aggregate", help="the study over several seeds' study pipeline folders")
    over_seeds.add_argument("folders", nargs="+", type=Path, help="one study pipeline folder per seed")
    over_seeds.add_argument("--out", type=Path, required=True, help="folder for study.json, study_table.md, plots")
    over_seeds.add_argument("--command", action="append", default=[], dest="commands",
                            help="a command that produced the results, recorded in study.json (repeatable)")
    over_seeds.add_argument("--device", help="the machine the results come from, recorded in study.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        aggregate(args.folders, args.out, args.commands, args.device)
    except UserError as err:
        logger.error("%s", err)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
