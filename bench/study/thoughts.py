"""What the taught students write before their solution (bench/study_fair.py ``outputs`` and ``thoughts``).

A taught student answers in the student format: a thought (what it learned from the teacher's explanations) between
the thought tags, then a solution between the solution tags, and only the solution's stated answer is graded. So a
student may be graded right with a thought that reached another answer, or wrong with a thought that was right.
``outputs`` keeps each eval run's answers as text (``<out>/<student>/<arm>_s<seed>.jsonl.xz``: per held-out question
its id, its right answer and the student's whole output, in the order ``export`` writes the run's flags), so that
what the students wrote can be read and graded again from the repository. ``thoughts`` grades each thought with the
eval's own grader (``rlt_mono.stages.eval.check_answer``, the thought taken as the answer: math-verify reads its
last ``\\boxed{}``) and, per student, arm and held-out set, gives the share of answers with both parts, the thought's
accuracy beside the graded one, how often they disagree either way, and a cross-check of the graded flags against a
grader that shares no code with the eval's (the solution's last "The answer is <number>" compared as a number).
The thoughts' accuracy is compared with each other's and with graded answers (``THOUGHT_DIFFERENCES``) under the
summary's bootstrap over seeds, templates and questions.
"""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import numpy as np

from rlt_mono.data.prompts import between
from rlt_mono.runs.atomic_write import write_bytes
from study.answers import _eval_runs, _exported_runs
from study.kept import read_kept
from study.layout import SETS, StudyError

OUTPUTS_SUFFIX = ".jsonl.xz"
# The differences reported, each (arm, measure) - (arm, measure): "thought" the thought's accuracy (an answer without
# a thought counts as a wrong thought), the same by its last \boxed{} alone, "graded" the graded accuracy. The taught
# arms' thoughts against each other, against their own graded answers, and against the untrained student's graded
# answers (the plain prompt: the better untrained one in the study).
THOUGHT, THOUGHT_BOXED, GRADED = "thought", "thought, its last boxed alone", "graded"
MEASURE_FIELDS = {THOUGHT: "thought_right", THOUGHT_BOXED: "thought_right_boxed", GRADED: "correct"}
THOUGHT_DIFFERENCES = tuple(
    [
        ((a, measure), (b, measure))
        for a, b in (
            ("rl_teacher", "sft_teacher"),
            ("rl_teacher", "rl_teacher_answer_only"),
            ("rl_teacher", "traces"),
            ("sft_teacher", "traces"),
        )
        for measure in (THOUGHT, THOUGHT_BOXED)
    ]
    + [((a, THOUGHT), (a, GRADED)) for a in ("rl_teacher", "sft_teacher")]
    + [((a, THOUGHT), ("untrained_plain", GRADED)) for a in ("rl_teacher", "sft_teacher")]
)
# The plain grader's reading: a number right after "The answer is" (a colon, markup or an opening delimiter between),
# else a number alone in the last \boxed{}.
_STATED_NUMBER = re.compile(r"The answer is[:\s]*[*$\\(\[{ ]*(-?[\d,]*\.?\d+)")
_BOXED_NUMBER = re.compile(r"\\boxed\{\s*\$?(-?[\d,]*\.?\d+)\s*\}")


def write_outputs(root: Path, out: Path) -> list[Path]:
    """Each finished eval run under ``root`` as ``out/<student>/<arm>_s<seed>.jsonl.xz``, one JSON line per held-out
    question ``export`` keeps (``question`` id, ``answer``, ``output``), in its order; refuses to overwrite one."""
    written = []
    for student, arm, seed, rows, _ in _eval_runs(root):
        rows = [row for row in rows if row.get("heldout") in SETS and row.get("correct") is not None]
        path = out / student / f"{arm}_s{seed}{OUTPUTS_SUFFIX}"
        if path.exists():
            raise StudyError(f"{path} exists: a run's outputs are written once (delete it to write them again)")
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(
            json.dumps(
                {"question": row["question"], "answer": row.get("answer"), "output": row.get("student_output") or ""},
                ensure_ascii=False,
            )
            + "\n"
            for row in rows
        )
        write_bytes(path, lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
        written.append(path)
    if not written:
        raise StudyError(
            f"no finished <student>/<arm>/eval/eval_rows.jsonl under {root}: pass the folder bench/study_fair.sh wrote"
        )
    return written


def read_outputs(path: Path) -> dict[str, dict]:
    """``write_outputs``' file as ``{question id: {"answer", "output"}}``."""
    with lzma.open(path, "rt") as lines:
        return {row["question"]: row for row in map(json.loads, lines)}


def plain_right(solution: str | None, answer: str | None) -> bool | None:
    """A grader apart from the eval's: whether the solution's last "The answer is <number>" (else its last
    ``\\boxed{<number>}``) equals ``answer`` as a number; None where it states no number so (an expression, a cut
    answer) or the answer is no number."""
    stated = _STATED_NUMBER.findall(solution or "") or _BOXED_NUMBER.findall(solution or "")
    if not stated or answer is None:
        return None
    try:
        return float(stated[-1].replace(",", "")) == float(str(answer).replace(",", ""))
    except ValueError:
        return None


def last_boxed(text: str | None) -> str | None:
    """The last ``\\boxed{...}`` of ``text``, braces inside it matched; None where there is none or it is not
    closed."""
    from rlt_mono.stages.eval import boxed

    return boxed(text or "", last=True)


def right(answer: str, text: str | None, boxed_only: bool = False) -> bool:
    """Whether ``text``, graded as an answer by the eval's grader (``rlt_mono.stages.eval.check_answer``: the
    sentence after its last "The answer is", else what math-verify reads in it, a ``\\boxed{}`` first), gives
    ``answer``; with ``boxed_only`` its last ``\\boxed{}`` alone is graded, and a text without one is wrong."""
    from rlt_mono.stages.eval import check_answer  # math-verify, loaded where answers are graded

    if boxed_only:
        text = last_boxed(text)
    return text is not None and bool(check_answer({"answer": answer, "solution": ""}, text)[0])


def grade(row: dict, output: str) -> dict:
    """One answer's parts: ``thought`` (it holds a whole thought, its end tag reached, with some text in it),
    ``thought_right`` and ``thought_right_boxed`` (that thought graded as the answer by ``right``, and by its last
    ``\\boxed{}`` alone; None without a thought), ``correct`` (the graded flag, from ``row``), ``regraded`` (the
    eval's grader on the whole output again, here: the flag it should give back) and ``plain_right``."""
    thought, solution = between(output, "thought"), between(output, "solution")
    has = bool(thought and thought.strip())
    return {
        "thought": has,
        "thought_right": right(row["answer"], thought) if has else None,
        "thought_right_boxed": right(row["answer"], thought, boxed_only=True) if has else None,
        "correct": bool(row["correct"]),
        "regraded": right(row["answer"], output),
        "plain_right": plain_right(solution if solution is not None else output, row["answer"]),
    }


def graded_runs(answers: Path, outputs: Path) -> dict[str, dict[str, dict[int, list[dict]]]]:
    """``{student: {arm: {seed: rows}}}`` for every exported run under ``answers`` whose outputs are under
    ``outputs``: each row the exported one (``question``, ``heldout``, ``template``, ``correct``) with ``grade``'s
    fields. A run whose outputs hold other questions than its exported flags is refused."""
    runs: dict = {}
    for student, arm, seed, rows in _exported_runs(answers):
        path = outputs / student / f"{arm}_s{seed}{OUTPUTS_SUFFIX}"
        if not path.is_file():
            continue
        texts = read_outputs(path)
        if set(texts) != {row["question"] for row in rows}:
            raise StudyError(
                f"{path}: its questions are not those of {answers / student / f'{arm}_s{seed}.json'}: "
                "the outputs of another run"
            )
        runs.setdefault(student, {}).setdefault(arm, {})[seed] = [
            {**row, **grade({**row, "answer": texts[row["question"]]["answer"]}, texts[row["question"]]["output"])}
            for row in rows
        ]
    if not runs:
        raise StudyError(f"no run under {answers} has its outputs under {outputs} (bench/study_fair.py outputs)")
    return runs


def _share(values: list) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


def arm_figures(per_seed: dict[int, list[dict]], held_out: str) -> dict:
    """One arm on one held-out set, every seed's answers pooled: ``answers``, ``with_thought`` (share with a
    thought), ``graded_right``, ``thought_right`` (an answer without a thought has no right thought),
    ``thought_right_boxed`` (its last ``\\boxed{}`` alone), ``right_thought_wrong``, ``wrong_thought_right``,
    ``thought_right_per_seed`` (these five None where no answer has a thought: an untrained student, or students
    taught an empty thought), and ``_grader_checks``."""
    rows = [row for rows in per_seed.values() for row in rows if row["heldout"] == held_out]
    thoughts = {
        "thought_right": _share([bool(row["thought_right"]) for row in rows]),
        "thought_right_boxed": _share([bool(row["thought_right_boxed"]) for row in rows]),
        "right_thought_wrong": _share([row["correct"] and not row["thought_right"] for row in rows]),
        "wrong_thought_right": _share([not row["correct"] and bool(row["thought_right"]) for row in rows]),
        "thought_right_per_seed": [
            _share([bool(row["thought_right"]) for row in per_seed[seed] if row["heldout"] == held_out])
            for seed in sorted(per_seed)
        ],
    }
    if not any(row["thought"] for row in rows):  # no thought to grade
        thoughts = dict.fromkeys(thoughts)
    return {
        "answers": len(rows),
        "with_thought": _share([row["thought"] for row in rows]),
        "graded_right": _share([row["correct"] for row in rows]),
        **thoughts,
        **_grader_checks(rows),
    }


def _grader_checks(rows: list[dict]) -> dict:
    """``plain_grader_agrees`` (over the answers ``plain_right`` reads: their share, ``plain_grader_read``) and
    ``regrade_agrees`` (the exported flags the eval's grader gives again from the text)."""
    return {
        "plain_grader_agrees": _share(
            [row["plain_right"] == row["correct"] for row in rows if row["plain_right"] is not None]
        ),
        "plain_grader_read": _share([row["plain_right"] is not None for row in rows]),
        "regrade_agrees": _share([row["regraded"] == row["correct"] for row in rows]),
    }


def _matrix(per_seed: dict[int, list[dict]], held_out: str, measure: str, questions: list[str]) -> np.ndarray:
    """(seeds x questions): 1 where that seed's answer is right by ``measure`` (``MEASURE_FIELDS``)."""
    field = MEASURE_FIELDS[measure]
    by_seed = [
        {row["question"]: row for row in per_seed[seed] if row["heldout"] == held_out} for seed in sorted(per_seed)
    ]
    return np.array([[float(bool(rows[q][field])) for q in questions] for rows in by_seed])


def _answered(per_seed: dict[int, list[dict]], held_out: str) -> set[str]:
    """The questions of ``held_out`` every seed answered."""
    return set.intersection(
        *({row["question"] for row in rows if row["heldout"] == held_out} for rows in per_seed.values())
    )


def difference(
    arms: dict, first: tuple[str, str], second: tuple[str, str], held_out: str, resamples: int, rng: np.random.Generator
) -> dict:
    """``first`` − ``second``, each ``(arm, measure)``, on the questions both arms answered, with the summary's
    percentile bootstrap: the same templates and questions for both (paired), each arm's seeds apart, or, for two
    measures of one arm, the same seeds for both (paired over its runs too)."""
    # (here: study.stats loads rlt_mono.study.aggregate and its imports, which ``outputs`` on a GPU host does without)
    from study.stats import _interval, _question_weights

    questions = sorted(_answered(arms[first[0]], held_out) & _answered(arms[second[0]], held_out))
    if not questions:
        return {"questions": 0}
    template = {row["question"]: row["template"] for rows in arms[first[0]].values() for row in rows}
    weights = _question_weights(np.array([template[q] for q in questions]), resamples, rng)
    matrices = [_matrix(arms[arm], held_out, measure, questions) for arm, measure in (first, second)]
    same_runs = first[0] == second[0]
    picks = [rng.integers(len(m), size=(resamples, len(m))) for m in matrices]
    if same_runs:
        picks[1] = picks[0]
    boot = [(weights * m[p].mean(axis=1)).sum(1) / weights.sum(1) for m, p in zip(matrices, picks, strict=True)]
    return {
        "questions": len(questions),
        "difference": round(float(matrices[0].mean() - matrices[1].mean()), 4),
        "ci95": _interval(boot[0] - boot[1]),
    }


def summarize_thoughts(runs: dict, resamples: int, seed: int) -> dict:
    """Per student: ``arms`` (``arm_figures`` per held-out set, with the arm's ``seeds``) and ``differences``
    (``THOUGHT_DIFFERENCES`` present, per held-out set)."""
    from study.stats import stream  # (as in ``difference``)

    students = {}
    for student, arms in sorted(runs.items()):
        entry = {
            "arms": {
                arm: {
                    "seeds": sorted(per_seed),
                    **{name: arm_figures(per_seed, held_out) for held_out, name in SETS.items()},
                }
                for arm, per_seed in sorted(arms.items())
            },
            "differences": {},
        }
        for first, second in THOUGHT_DIFFERENCES:
            if first[0] in arms and second[0] in arms:
                entry["differences"][f"{first[0]} ({first[1]}) - {second[0]} ({second[1]})"] = {
                    name: difference(arms, first, second, held_out, resamples,
                                     stream(seed, student, *first, *second, held_out))
                    for held_out, name in SETS.items()
                }
        students[student] = entry
    return students


def explanation_right(row: dict, boxed_only: bool = False) -> bool:
    """Whether a kept teacher's explanation, graded as an answer by ``right``, gives the row's right answer: what a
    student that copies it into its thought would conclude."""
    return right(row["answer"], row.get("explanation") or "", boxed_only)


# The reward's parts a kept row carries (the distill's scores of the explanation it kept).
REWARD_PARTS = ("r_ss", "r_kl")


def _reward_parts(rows: list[dict], ends_right: list[bool]) -> dict:
    """The mean of each of ``REWARD_PARTS`` over the explanations that end on the right answer and over the others
    (``right``/``wrong``, with their counts: ``ends_right`` says which); a part no row carries is left out."""
    parts = {}
    for label, keep in (("right", True), ("wrong", False)):
        chosen = [row for row, ok in zip(rows, ends_right, strict=True) if ok is keep]
        parts[label] = {
            "rows": len(chosen),
            **{
                part: round(float(np.mean([row[part] for row in chosen])), 4)
                for part in REWARD_PARTS
                if chosen and all(isinstance(row.get(part), float | int) for row in chosen)
            },
        }
    return parts


def teachers_figures(explanations: Path, resamples: int, seed: int) -> dict:
    """Per kept teacher (``keep``'s folder): ``rows``, ``boxed`` (share of explanations with a ``\\boxed{}``),
    ``right`` (``explanation_right``) with a percentile-bootstrap ``ci95`` over templates, then questions within
    them, ``right_boxed`` (by the last ``\\boxed{}`` alone), ``reward_parts`` (``_reward_parts``); each RL
    teacher's ``minus_sft`` against each SFT sample on the questions both explained (paired), both ways."""
    from study.stats import _interval, _question_weights, stream  # (as in ``difference``)

    kept = {name: {row["question_id"]: row for _, row in pairs} for name, pairs in read_kept(explanations).items()}
    graded = {name: {q: explanation_right(row) for q, row in rows.items()} for name, rows in kept.items()}
    boxed = {
        name: {q: explanation_right(row, boxed_only=True) for q, row in rows.items()} for name, rows in kept.items()
    }
    figures = {}
    for name, rows in kept.items():
        questions = sorted(rows)
        weights = _question_weights(np.array([rows[q].get("template", -1) for q in questions]), resamples,
                                    stream(seed, name))
        ends_right = np.array([float(graded[name][q]) for q in questions])
        figures[name] = {
            "rows": len(questions),
            "boxed": _share(["\\boxed" in (rows[q].get("explanation") or "") for q in questions]),
            "right": _share(list(ends_right)),
            "ci95": _interval((weights * ends_right).sum(1) / weights.sum(1)),
            "right_boxed": _share([boxed[name][q] for q in questions]),
            "reward_parts": _reward_parts([rows[q] for q in questions], [graded[name][q] for q in questions]),
        }
    sft = [name for name in kept if name == "sft" or name.startswith("sft_")]
    for name in kept:
        if name.startswith("rl_"):
            figures[name]["minus_sft"] = {}
            for other in sft:
                questions = sorted(set(kept[name]) & set(kept[other]))
                weights = _question_weights(
                    np.array([kept[name][q].get("template", -1) for q in questions]),
                    resamples,
                    stream(seed, name, other),
                )
                delta, delta_boxed = (
                    np.array([float(by[name][q]) - float(by[other][q]) for q in questions]) for by in (graded, boxed)
                )
                figures[name]["minus_sft"][other] = {
                    "questions": len(questions),
                    "difference": round(float(delta.mean()), 4),
                    "ci95": _interval((weights * delta).sum(1) / weights.sum(1)),
                    "difference_boxed": round(float(delta_boxed.mean()), 4),
                    "ci95_boxed": _interval((weights * delta_boxed).sum(1) / weights.sum(1)),
                }
    return figures


def table(students: dict, teachers: dict | None = None) -> str:
    """A Markdown table: per student, arm and held-out set the graded and the thought's accuracy; the differences;
    with ``teachers`` (``teachers_figures``) a table of the kept explanations' own answers."""
    lines = [
        "| student | arm | seeds | held-out set | with a thought | graded right | thought right | by its last "
        "\\boxed{} alone | right, thought wrong | wrong, thought right | plain grader agrees |",
        "| --- " * 11 + "|",
    ]
    for student, entry in students.items():
        for arm, figures in entry["arms"].items():
            for name in SETS.values():
                f = figures[name]
                cells = [
                    f[k] if f[k] is not None else "-"
                    for k in (
                        "with_thought",
                        "graded_right",
                        "thought_right",
                        "thought_right_boxed",
                        "right_thought_wrong",
                        "wrong_thought_right",
                        "plain_grader_agrees",
                    )
                ]
                lines.append(
                    f"| {student} | {arm} | {', '.join(map(str, figures['seeds']))} | {name} | "
                    + " | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells)
                    + " |"
                )
    notes = [
        f"- {student}, {label}, {name}: {d['difference']:+.3f} [{d['ci95'][0]:+.3f}, "
        f"{d['ci95'][1]:+.3f}] ({d['questions']} questions)"
        for student, entry in students.items()
        for label, sets in entry["differences"].items()
        for name, d in sets.items()
        if d.get("questions")
    ]
    if teachers:
        notes += [
            "",
            "| kept teacher | rows | with a \\boxed{} | its explanation's answer right [95%] | by its last \\boxed{} "
            "alone | − each SFT sample | r_SS, r_KL of those right | of the others |",
            "| --- " * 8 + "|",
        ]
        for name, f in teachers.items():
            minus = "; ".join(
                f"{other} {d['difference']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
                for other, d in f.get("minus_sft", {}).items()
            )
            parts = [
                ", ".join(
                    f"{f['reward_parts'][side][part]:.3f}" for part in REWARD_PARTS if part in f["reward_parts"][side]
                )
                or "-"
                for side in ("right", "wrong")
            ]
            notes.append(
                f"| {name} | {f['rows']} | {f['boxed']:.3f} | {f['right']:.3f} [{f['ci95'][0]:.3f}, "
                f"{f['ci95'][1]:.3f}] | {f['right_boxed']:.3f} | {minus or '-'} | {parts[0]} | {parts[1]} |"
            )
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"
