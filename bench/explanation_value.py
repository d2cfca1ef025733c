"""What the explanation is worth to the student (a diagnostic of the study): r_SS, the frozen student's score of the
worked solution (docs/METHOD.md, "The reward"), on the same questions read four ways: after no explanation (an
empty thought), after each kept teacher's explanation, and after the worked solution itself as the explanation
(what a teacher that gave the whole solution away would reach). If RL leaves r_SS flat, this says whether any
explanation moves it: the room between "none" and "the solution itself" is all a teacher can win.

``--solution answer`` scores the answer line alone (``The answer is N.``, the study's answer-only mapping,
``data.gsm_solution=answer``) after the same thoughts: how much the explanations carry the answer itself.

Each reading also splits the solution's mean log-prob into its first OPENING tokens (how a solution opens after the
thought) and the rest (the steps).

The questions are a seeded sample of those every named teacher explained (``study_fair.py keep``'s folder),
stratified by template (``rlt_mono.data.rows.sample_rows``). The student and the reward settings come from the
``distill`` run config and its overrides, as the study's distill scored the rows; each teacher's rows, scored
again here, reproduce the distill's own ``r_ss`` to within the precision of the device (``reproduces``: each
teacher's mean and largest difference, a warning above REPRODUCE_TOLERANCE; none under ``--solution answer``, which
the distill did not score). r_SS reads the student's log-probs at the reward's temperature
(``reward.unbias_student_log_probs_temp``, 0.7 in the RLT run), as the reward does. Intervals: 95% bootstrap of the
paired mean difference, templates resampled, then questions within them.

``--kept`` loads no model: it compares the named teachers on the scores their distill recorded with each kept row
(``r_ss``, ``r_kl``, ``total``), paired on every question they all explained (``--questions 0``) or on a sample, with
the same intervals; seconds on any machine.

    python bench/explanation_value.py study_data/gsm_symbolic_v2/explanations --teachers sft,rl_s0 --questions 64 \\
        --out results/study_gsm_symbolic_v2/explanation_value.json student=qwen2.5_coder_0.5b_instruct
    python bench/explanation_value.py study_data/gsm_symbolic_v2/explanations --teachers sft,rl_s1 --kept \\
        --questions 0 --out results/study_gsm_symbolic_v2/kept_scores_s1.json
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # rlt_mono, and the scripts beside this one however it was loaded

from bench_mono import code_commit  # noqa: E402
from study_fair import StudyError, _interval, _question_weights, read_kept  # noqa: E402

from rlt_mono.config import ConfigError, compose, instantiate  # noqa: E402
from rlt_mono.data.models import dtype_name, load_model, load_tokenizer, model_path  # noqa: E402
from rlt_mono.data.rows import group_of, sample_rows  # noqa: E402
from rlt_mono.rewards import TeacherRewardConfig  # noqa: E402
from rlt_mono.rewards.teacher_kl import TeacherKLReward  # noqa: E402
from rlt_mono.runs.atomic_write import write_json  # noqa: E402
from rlt_mono.study.eval_stats import RESAMPLES  # noqa: E402

logger = logging.getLogger("explanation_value")

NONE, WORKED = "none", "worked_solution"  # the two readings that are not a teacher's
# A teacher's rows scored here farther than this from the distill's own r_ss (per question) are warned about: the
# student in float32 on a CPU against bfloat16 on a GPU measured 0.024 at most over 96 questions.
REPRODUCE_TOLERANCE = 0.05
# The solution's first tokens, apart: how a solution opens after a thought, against the steps that follow.
OPENING = 5
# What --kept compares: the scores the distill wrote with each kept row.
KEPT_SCORES = ("r_ss", "r_kl", "total")


def teachers_rows(folder: Path, teachers: list[str]) -> dict[str, dict[str, dict]]:
    """``{teacher: {question_id: row}}`` of each named teacher kept in ``folder`` (``study_fair.read_kept``: each
    file checked against its sha256)."""
    kept = read_kept(folder)
    missing = [name for name in teachers if name not in kept]
    if missing:
        raise ConfigError(f"{folder}: no kept explanations of {', '.join(missing)} (kept: {', '.join(kept)})")
    return {name: {row["question_id"]: row for _, row in kept[name]} for name in teachers}


def common_questions(rows: dict[str, dict[str, dict]], count: int, seed: int) -> list[dict]:
    """A seeded sample of ``count`` questions every teacher explained, stratified by template (the first
    teacher's rows, which carry question, solution and template); all of them, by question id, for 0."""
    shared = set.intersection(*(set(by_id) for by_id in rows.values()))
    first = next(iter(rows.values()))
    ordered = [first[qid] for qid in sorted(shared)]
    if len(ordered) < 2:
        raise ConfigError(f"{', '.join(rows)} share {len(ordered)} questions: nothing to pair (at least 2)")
    if count > len(ordered):
        raise ConfigError(f"--questions {count}: the teachers share only {len(ordered)} questions")
    return ordered if count == 0 else sample_rows(ordered, count, seed, group_of)


def readings(questions: list[dict], rows: dict[str, dict[str, dict]]) -> dict[str, list[str]]:
    """The explanation each reading puts in the student's thought, per question."""
    out = {NONE: ["" for _ in questions]}
    for name, by_id in rows.items():
        out[name] = [by_id[q["question_id"]]["explanation"] for q in questions]
    out[WORKED] = [q["solution"] for q in questions]
    return out


def scored_solution(question: dict, solution: str) -> str:
    """The text r_SS scores: the worked solution, or (``answer``) its answer line alone, as
    ``rlt_mono.data.gsm_symbolic`` writes it."""
    return question["solution"] if solution == "worked" else f"The answer is {question['answer']}."


def score(reward: TeacherKLReward, questions: list[dict], explanations: list[str],
          solution: str = "worked") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(r_ss, mean solution log-prob, mean log-prob of its first OPENING tokens, of the rest)`` per question, the
    student reading ``explanations`` (NaN where a solution has no token past the opening)."""
    end = reward.prompt_format.explanation_end
    ids = [reward.tokenizer(text + end, add_special_tokens=False).input_ids for text in explanations]
    scores = reward.score_students([q["question"] for q in questions],
                                   [scored_solution(q, solution) for q in questions], ids)
    terms = reward.score([s.sample for s in scores], [s.solution_log_probs for s in scores],
                         [s.explanation_log_probs for s in scores], None)
    mean_lp = np.array([float(s.solution_log_probs.mean()) for s in scores])
    opening = np.array([float(s.solution_log_probs[:OPENING].mean()) for s in scores])
    rest = np.array([float(s.solution_log_probs[OPENING:].mean()) if len(s.solution_log_probs) > OPENING
                     else np.nan for s in scores])
    return terms.r_ss.double().numpy(), mean_lp, opening, rest


def paired_interval(diff: np.ndarray, templates: np.ndarray, rng: np.random.Generator) -> list[float]:
    """95% bootstrap interval of ``diff.mean()``: templates resampled, then questions within each drawn one (the
    study's own resampling, ``study_fair._question_weights``)."""
    weights = _question_weights(templates, RESAMPLES, rng)
    return _interval(weights @ diff / weights.sum(axis=1))


def _kept_score(row: dict, teacher: str, key: str) -> float:
    """A kept row's score ``key``, which must be a finite number (a missing or NaN score would make every mean and
    difference NaN)."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ConfigError(f"{teacher}: question {row.get('question_id')}: {key} is {value!r}, not a finite number: "
                          "--kept compares the scores the distill wrote")
    return float(value)


def kept_differences(rows: dict[str, dict[str, dict]], teachers: list[str], questions: list[dict],
                     rng: np.random.Generator) -> tuple[dict, dict]:
    """``(means, differences)`` of the distill's own KEPT_SCORES: each teacher's mean per score, and per pair of
    teachers (later - earlier) the paired mean difference per score with its interval (``paired_interval``)."""
    templates = np.array([q["template"] for q in questions])
    values = {name: {key: np.array([_kept_score(rows[name][q["question_id"]], name, key) for q in questions])
                     for key in KEPT_SCORES} for name in teachers}
    means = {name: {key: round(float(v.mean()), 4) for key, v in by_key.items()} for name, by_key in values.items()}
    differences = {}
    for i in range(len(teachers)):
        for j in range(i + 1, len(teachers)):
            a, b = teachers[j], teachers[i]
            differences[f"{a} - {b}"] = {}
            for key in KEPT_SCORES:
                diff = values[a][key] - values[b][key]
                differences[f"{a} - {b}"][key] = {"mean": round(float(diff.mean()), 4),
                                                  "ci95": paired_interval(diff, templates, rng)}
    return means, differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="study_fair.py keep's folder")
    parser.add_argument("--teachers", required=True, help="kept teachers, comma-separated (e.g. sft,rl_s0)")
    parser.add_argument("--questions", type=int, default=64, help="a sample of this many (0: every common one)")
    parser.add_argument("--kept", action="store_true",
                        help="no model: compare the teachers on the scores their distill kept with each row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--solution", choices=("worked", "answer"), default="worked",
                        help="what r_SS scores: the worked solution, or its answer line alone")
    parser.add_argument("--config", default="distill", help="the run config whose student and reward score")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of --config")
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started, commit = time.perf_counter(), code_commit()  # the code as the run starts (a long run outlives HEAD)
    command = "python bench/explanation_value.py " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        if args.questions < 2 and args.questions != 0:
            raise ConfigError(f"--questions {args.questions}: at least 2, or 0 for every common question")
        teachers = [name for name in args.teachers.split(",") if name]
        if not teachers or set(teachers) & {NONE, WORKED}:
            raise ConfigError(f"--teachers {args.teachers}: kept teachers' names, not {NONE} or {WORKED}")
        if len(set(teachers)) < len(teachers):
            raise ConfigError(f"--teachers {args.teachers}: a teacher named twice")
        if args.kept and (len(teachers) < 2 or args.overrides or args.solution != "worked"):
            raise ConfigError("--kept compares two or more kept teachers on their distill's scores: no overrides, "
                              "no --solution")
        rows = teachers_rows(args.folder, teachers)
        questions = common_questions(rows, args.questions, args.seed)
        if args.kept:
            return write_kept(args, rows, teachers, questions, {"commit": commit, "command": command}, started)
        cfg = compose(args.config, args.overrides)
        reward_config = instantiate(TeacherRewardConfig, cfg.reward, "reward")
        # r_SS alone: the teacher's half of r_KL is not needed, so no teacher model is loaded
        reward_config = dataclasses.replace(reward_config, include_teacher_think_entropy=False)
        path = model_path(cfg.student, cfg.seed, "student")
        student = load_model(path, "student.model_name_or_path", dtype=dtype_name(cfg.student.dtype))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        reward = TeacherKLReward(student.to(device), load_tokenizer(path, "student.model_name_or_path"),
                                 reward_config)
    except (ConfigError, StudyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    texts = readings(questions, rows)
    per_reading = {}
    for name, explanations in texts.items():
        logger.info("scoring %d questions, the student reading: %s", len(questions), name)
        per_reading[name] = score(reward, questions, explanations, args.solution)
    templates = np.array([q["template"] for q in questions])
    rng = np.random.default_rng(args.seed)
    reproduces = None
    if args.solution == "worked":  # each teacher's rows scored again against the distill's own r_ss
        reproduces = {}
        for name in teachers:
            diff = per_reading[name][0] - np.array([rows[name][q["question_id"]]["r_ss"] for q in questions])
            reproduces[name] = {"mean_difference": round(float(diff.mean()), 4),
                                "max_abs_difference": round(float(np.abs(diff).max()), 4)}
            if reproduces[name]["max_abs_difference"] > REPRODUCE_TOLERANCE:
                logger.warning("%s: r_SS scored here differs from the distill's by up to %.3f (> %.2f): another "
                               "student, dtype or reward setting than the distill's?", name,
                               reproduces[name]["max_abs_difference"], REPRODUCE_TOLERANCE)
    result = {
        "questions": len(questions), "templates": int(len(np.unique(templates))), "seed": args.seed,
        "solution": args.solution,
        "readings": {name: {"r_ss": round(float(r_ss.mean()), 4), "mean_solution_log_prob": round(float(lp.mean()), 4),
                            f"mean_log_prob_first_{OPENING}": round(float(first.mean()), 4),
                            f"mean_log_prob_after_{OPENING}": round(float(np.nanmean(rest)), 4)}
                     for name, (r_ss, lp, first, rest) in per_reading.items()},
        "differences": {},
        "reproduces": reproduces,
        "per_question": [{"question_id": q["question_id"], "template": q["template"],
                          **{name: round(float(per_reading[name][0][i]), 4) for name in per_reading}}
                         for i, q in enumerate(questions)],
        "commit": commit, "device": torch.cuda.get_device_name() if device == "cuda" else
        f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "command": command, "seconds": round(time.perf_counter() - started, 1)}
    pairs = [(name, NONE) for name in [*teachers, WORKED]] + [(WORKED, name) for name in teachers]
    pairs += [(teachers[j], teachers[i]) for i in range(len(teachers)) for j in range(i + 1, len(teachers))]
    for a, b in pairs:
        diff = per_reading[a][0] - per_reading[b][0]
        result["differences"][f"{a} - {b}"] = {"r_ss": round(float(diff.mean()), 4),
                                               "ci95": paired_interval(diff, templates, rng)}
    write_json(args.out, result)
    for name, figures in result["readings"].items():
        print(f"{name:>16}: r_SS {figures['r_ss']:+.3f}, "
              f"mean solution log-prob {figures['mean_solution_log_prob']:+.3f} "
              f"(first {OPENING} tokens {figures[f'mean_log_prob_first_{OPENING}']:+.3f}, "
              f"the rest {figures[f'mean_log_prob_after_{OPENING}']:+.3f})")
    for pair, figures in result["differences"].items():
        print(f"{pair:>32}: {figures['r_ss']:+.3f} [{figures['ci95'][0]:+.3f}, {figures['ci95'][1]:+.3f}]")
    return 0


def write_kept(args: argparse.Namespace, rows: dict[str, dict[str, dict]], teachers: list[str],
               questions: list[dict], where: dict, started: float) -> int:
    """``--kept``: write and log the teachers' own scores and their paired differences (``where``: the run's
    ``commit`` and ``command``)."""
    means, differences = kept_differences(rows, teachers, questions, np.random.default_rng(args.seed))
    result = {"questions": len(questions), "templates": len({q["template"] for q in questions}), "seed": args.seed,
              "scores": "kept", "teachers": means, "differences": differences, "commit": where["commit"],
              "device": f"CPU ({platform.processor() or platform.machine()}), no model",
              "command": where["command"], "seconds": round(time.perf_counter() - started, 1)}
    write_json(args.out, result)
    for pair, by_key in differences.items():
        logger.info("%s: %s", pair, ", ".join(f"{key} {v['mean']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}]"
                                              for key, v in by_key.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
