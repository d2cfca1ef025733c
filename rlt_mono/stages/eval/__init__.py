"""The eval stage (``stage: eval``) and ``compare``: how good a teacher's explanations and a student are.

On the held-out rows (``eval.split=eval``), for the teacher ``model.model_name_or_path`` and the student
``student.model_name_or_path`` (any checkpoints, e.g. a teacher_rlt run's ``final/`` and a student SFT run's):

- teacher half (skipped with ``model.model_name_or_path=null``): one explanation per question, sampled as in
  distill, scored by ``TeacherKLReward``: the mean reward and each component (``r_ss``, ``r_kl``,
  ``match_penalty``), the unmatched fraction (explanation tag never closed), and the student's per-token
  log-prob of the solution given the question and that explanation (temperature 1, mean over the solution's
  tokens; the reward's ``r_ss`` uses the reward's temperature instead);
- student half (``eval.student_accuracy``): the student answers from the question alone (its chat with system
  and user turns only, greedy); a row is checkable when it has an ``answer`` column or its solution says "The
  answer is N". math-verify parses and compares the answers (``check_answer``): the student's stated answer (after
  its last "The answer is", the format student SFT teaches; else its solution section; else its whole output,
  where math-verify takes a ``\boxed{}`` first). An output with no answer math-verify can parse counts as wrong
  and is counted apart (``student/unparsed_frac``).

``eval.split=train`` runs the student half alone on the training questions instead: the right answers of a larger
model asked with ``eval.student_prompt=plain`` are the larger-model traces of the fair study (bench/study_fair.py
traces).

Each figure is a mean over questions with a percentile-bootstrap interval (``eval.confidence``, resampling
questions ``eval.bootstrap_resamples`` times with the run's seed). Output: ``eval.json`` (the figures) and
``eval_rows.jsonl`` (one line per question: explanation, reward components, the student's answer).

This package declares the stage, checks its options, reads answers and holds the command line (``compare``,
``rescore``; ``__main__``); the stage's models and generation (``rlt_mono.stages.eval_run``) are imported when it runs.

Run::

    ./launch_mono.sh cfgs/run_cfg/eval.yaml model.model_name_or_path=<teacher> student.model_name_or_path=<student>
    python -m rlt_mono.stages.eval compare outputs/eval/a/eval.json outputs/eval/b/eval.json   # one markdown table
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from rlt_mono.config import ConfigError, config_group, instantiate
from rlt_mono.data.prompts import PromptFormat, begin_tag
from rlt_mono.data.rows import SPLITS
from rlt_mono.errors import UserError
from rlt_mono.runs.atomic_write import write_json, write_text
from rlt_mono.stages import eval_compare
from rlt_mono.stages.base import Stage
from rlt_mono.stages.eval_compare import cell
from rlt_mono.stages.sampling_options import SamplingOptions
from rlt_mono.study.eval_stats import (
    CONFIDENCE,
    EVAL_FILE,
    MIN_ROWS_FOR_INTERVAL,
    RESAMPLES,
    ROWS_FILE,
    read_rows,
    summarize,
)

if TYPE_CHECKING:
    from rlt_mono.rewards import TeacherRewardConfig

logger = logging.getLogger(__name__)

# Row fields averaged over questions -> the metric they are reported as.
METRICS = {
    "total": "teacher/reward",
    "r_ss": "teacher/r_ss",
    "r_kl": "teacher/r_kl",
    "match_penalty": "teacher/match_penalty",
    "unmatched": "teacher/unmatched_frac",
    "solution_log_prob": "student/solution_log_prob",
    "correct": "student/accuracy",
    "unparsed": "student/unparsed_frac",
    "capped": "student/capped_frac",
}
# eval.student_prompt: the student chat (system prompt + question, the format student SFT teaches) or a plain
# request for steps (an untrained instruct model's own way of answering).
STUDENT_PROMPTS = ("student", "plain")
PLAIN_REQUEST = "\n\nSolve this step by step. End with one line: The answer is <the number>."
# Where a stated answer starts: the sentence the embedded and GSM-Symbolic solutions end with.
THE_ANSWER_IS = "The answer is"
# A full stop that ends a sentence (not the point of 3.5), or a line break.
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\n")
_BOXED = "\\boxed{"


@config_group("eval")
@dataclass
class EvalConfig(SamplingOptions):
    """The ``eval`` config group (``cfgs/eval/default.yaml`` documents each field)."""

    split: str = "eval"
    student_accuracy: bool = True
    student_prompt: str = "student"
    student_max_new_tokens: int = 4096
    bootstrap_resamples: int = RESAMPLES
    confidence: float = CONFIDENCE

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {self.split!r}")
        if self.student_prompt not in STUDENT_PROMPTS:
            raise ValueError(f"student_prompt must be one of {list(STUDENT_PROMPTS)}, got {self.student_prompt!r}")
        if self.student_max_new_tokens < 1:
            raise ValueError(f"student_max_new_tokens must be >= 1, got {self.student_max_new_tokens}")
        if self.bootstrap_resamples < 1:
            raise ValueError(f"bootstrap_resamples must be >= 1, got {self.bootstrap_resamples}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")


# ---- statistics and answer checks -------------------------------------------------------------------------
def boxed(text: str, last: bool = False) -> str | None:
    """The first (``last``: the last) ``\\boxed{...}`` of ``text``, its braces matched; None where there is none
    or it is not closed."""
    start = text.rfind(_BOXED) if last else text.find(_BOXED)
    if start < 0:
        return None
    depth = 0
    for end in range(start + len(_BOXED) - 1, len(text)):  # from its opening brace
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start : end + 1]
    return None


def stated_answer(text: str) -> str:
    """The part of a text that states its answer: after its last "The answer is", else after its last solution
    tag, else all of it (math-verify then prefers a ``\\boxed{}``, an instruct model's own way)."""
    if THE_ANSWER_IS in text:  # that sentence only: up to the first full stop that ends it, or the line's end;
        # where that holds no digit ("The answer is:" on a line of its own, "\\[" on the next, "\\boxed{425}" below
        # it), the first \\boxed{} of what follows, if any (not its other numbers: working that comes after)
        said = text.rsplit(THE_ANSWER_IS, 1)[1].lstrip()
        first = _SENTENCE_END.split(said, maxsplit=1)[0]
        return first if any(ch.isdigit() for ch in first) else boxed(said) or first
    return text.rsplit(begin_tag("solution"), 1)[-1]


def check_answer(row: dict, student_output: str) -> tuple[bool | None, bool]:
    """``(correct, parsed)``: whether the student's output answers ``row`` correctly (None when the row has no
    checkable answer) and whether math-verify found an answer in it at all (an unparsed answer is wrong)."""
    from math_verify import parse, verify

    said = parse(stated_answer(student_output))
    if row.get("answer"):  # LaTeX-delimited, so that math-verify reads the whole expression, not its first number
        gold = parse(row["answer"] if "$" in row["answer"] else f"${row['answer']}$")
    elif THE_ANSWER_IS in row["solution"]:
        gold = parse(stated_answer(row["solution"]))
    else:
        return None, bool(said)
    return bool(gold) and bool(said) and bool(verify(gold, said)), bool(said)


# ---- the student's prompt and answers ---------------------------------------------------------------------
def student_question(prompt_format: PromptFormat, options: EvalConfig, question: str) -> list[dict[str, str]]:
    """The messages a student answers (``eval.student_prompt``): the student chat without its assistant turn
    (system + user), or the question with a plain request for steps and a stated answer."""
    if options.student_prompt == "plain":
        return [{"role": "user", "content": question + PLAIN_REQUEST}]
    return prompt_format.student_messages(question, "", "")[:2]


def answer_record(row: dict, student_output: str, capped: bool = False) -> dict:
    """The student half's fields of one eval row: its output, whether it is right, whether it parsed, whether it
    stopped at eval.student_max_new_tokens."""
    correct, parsed = check_answer(row, student_output)
    return {"student_output": student_output, "correct": correct, "unparsed": None if correct is None else not parsed,
            "capped": capped}


def summarize_records(records: list[dict], confidence: float, resamples: int, seed: int) -> dict:
    """``{"metrics": ...}``: every figure of ``METRICS`` the rows carry, as ``summarize`` gives it; with
    ``"by_heldout": {set: metrics}`` beside it when rows say which held-out set they are in (``heldout``:
    held-out instances of the training templates, held-out templates)."""
    def figures(subset: list[dict]) -> dict:
        return {name: summarize([float(r[field]) for r in subset if r.get(field) is not None], confidence,
                                resamples, seed)
                for field, name in METRICS.items() if any(field in r for r in subset)}

    summary = {"metrics": figures(records)}
    sets = sorted({r["heldout"] for r in records if r.get("heldout")})
    if sets:
        summary["by_heldout"] = {name: {"questions": sum(r.get("heldout") == name for r in records),
                                        "metrics": figures([r for r in records if r.get("heldout") == name])}
                                 for name in sets}
    return summary


def warn_too_few(summary: dict) -> None:
    """One warning naming every figure of ``summarize_records``' output whose interval rests on too few rows."""
    sets = {"": summary["metrics"], **{f" [{name}]": held["metrics"]
                                       for name, held in summary.get("by_heldout", {}).items()}}
    few = [f"{name}{label} (n={figure['n']})" for label, metrics in sets.items()
           for name, figure in metrics.items() if figure["too_few"]]
    if few:
        logger.warning("eval: %s rest on fewer than %d questions: their intervals are not to be trusted (marked "
                       "too_few in %s); evaluate more held-out rows", ", ".join(few), MIN_ROWS_FOR_INTERVAL, EVAL_FILE)


# A student that runs to its token cap on at least this share of the questions is reported: a broken model (one
# token over and over, as a student SFT whose weights went NaN wrote) or a cap too low for its answers.
CAPPED_WARNING_SHARE = 0.5


def warn_capped(summary: dict, max_new_tokens: int) -> None:
    """One warning when the student's answers ran to ``eval.student_max_new_tokens`` on at least
    ``CAPPED_WARNING_SHARE`` of the questions (``summarize_records``' output, ``capped`` figure)."""
    capped = summary["metrics"].get(METRICS["capped"])
    if capped is None or capped["mean"] < CAPPED_WARNING_SHARE:
        return
    logger.warning("eval: %.0f%% of the student's answers ran to eval.student_max_new_tokens=%d tokens without "
                   "ending: look at its answers in %s; a model that repeats one token is broken (its training "
                   "diverged), one whose answers are long needs a higher cap", 100 * capped["mean"], max_new_tokens,
                   ROWS_FILE)


# ---- the stage --------------------------------------------------------------------------------------------
def check_options(cfg: DictConfig) -> tuple[EvalConfig, TeacherRewardConfig]:
    """The stage's options and the reward's, checked before any model loads (also by the pipeline, when it plans)."""
    from rlt_mono.rewards import TeacherRewardConfig  # with the reward, which imports torch

    options = instantiate(EvalConfig, cfg.eval, "eval")
    reward_config = instantiate(TeacherRewardConfig, cfg.reward, "reward")
    if cfg.model.model_name_or_path is None and not options.student_accuracy:
        raise ConfigError("model.model_name_or_path=null and eval.student_accuracy=false leave nothing to evaluate: "
                          "set a teacher, or eval.student_accuracy=true")
    if options.split == "train" and cfg.model.model_name_or_path is not None:
        raise ConfigError("eval.split=train asks the student the training questions; the teacher half is for held-out "
                          "questions: set model.model_name_or_path=null, or eval.split=eval")
    if options.student_accuracy and importlib.util.find_spec("math_verify") is None:
        raise UserError("the held-out rows' answers are checked with math-verify, which is not installed: "
                        "pip install math-verify, or set eval.student_accuracy=false")
    return options, reward_config


def run_eval(cfg: DictConfig) -> Path:
    """Evaluate the configured teacher and student on the rows of ``eval.split`` (the held-out rows, or the training
    rows for the student alone); returns ``output_dir`` (``eval.json``)."""
    from rlt_mono.stages.eval_run import evaluate

    options, reward_config = check_options(cfg)
    return evaluate(cfg, options, reward_config)


def rescore(folder: Path, resamples: int = RESAMPLES) -> dict:
    """Check the stored student answers of an eval folder again with ``check_answer`` (after a change to how
    answers are read) and rewrite ``eval_rows.jsonl`` and the ``student/accuracy`` of ``eval.json``; returns the
    new figure. Nothing is generated again."""
    for name in (ROWS_FILE, EVAL_FILE):
        if not (folder / name).is_file():
            raise UserError(f"{folder}: no {name} here; pass an eval run folder (with {EVAL_FILE} and {ROWS_FILE})")
    rows = read_rows(folder)
    if not any("student_output" in r for r in rows):
        raise UserError(f"{folder / ROWS_FILE} holds no student answers to rescore (eval.student_accuracy was false)")
    for row in rows:
        if "student_output" in row:
            row.update(answer_record(row, row["student_output"], row.get("capped", False)))
    result = json.loads((folder / EVAL_FILE).read_text())
    result.update(summarize_records(rows, result["confidence"], resamples, result["seed"]))
    result["rescored"] = True
    write_text(folder / ROWS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    write_json(folder / EVAL_FILE, result, indent=2)
    return result["metrics"][METRICS["correct"]]


def main(argv: list[str] | None = None) -> int:
    """``python -m rlt_mono.stages.eval compare a/eval.json b/eval.json ...``: the table on stdout;
    ``python -m rlt_mono.stages.eval rescore <eval folder> ...``: check stored student answers again."""
    parser = argparse.ArgumentParser(prog="python -m rlt_mono.stages.eval", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    eval_compare.add_arguments(commands.add_parser("compare", help="one markdown table of several eval.json side by "
                                                   "side (rlt_mono.stages.eval_compare)"))
    again = commands.add_parser("rescore", help="check the stored student answers of eval folders again")
    again.add_argument("folders", nargs="+", help="eval run folders (with eval.json and eval_rows.jsonl)")
    args = parser.parse_args(argv)
    if args.command == "rescore":
        try:
            for folder in args.folders:
                sys.stdout.write(f"{folder}: student/accuracy {cell(rescore(Path(folder)))}\n")
        except UserError as err:
            sys.stderr.write(f"error: {err}\n")
            return err.exit_code
        return 0
    return eval_compare.run(args)


# Held-out accuracy of a student, and of a teacher through the frozen student (eval.json). Run config:
# cfgs/run_cfg/eval.yaml. It keeps no checkpoints: run again with the same output_dir, it redoes its results.
STAGE = Stage(
    name="eval",
    run=run_eval,
    config_groups=("model", "student", "data", "reward", "placement", "logging", "eval"),
    reads_data=True,
    sampling_group="eval",
    check=check_options,
)
