"""What the explanation is worth to the student (a diagnostic of the study): r_SS, the frozen student's score of the
worked solution (docs/METHOD.md, "The reward"), on the same questions read four ways: after no explanation (an
empty thought), after each kept teacher's explanation, and after the worked solution itself as the explanation
(what a teacher that gave the whole solution away would reach). If RL leaves r_SS flat, this says whether any
explanation moves it: the room between "none" and "the solution itself" is all a teacher can win.

``--solution answer`` scores the answer line alone (``The answer is N.``, the study's answer-only mapping,
``data.gsm_solution=answer``) after the same thoughts: how much the explanations carry the answer itself.

``--rewrite plain`` adds, for each teacher, a reading of its explanations rewritten into plain text (``plain_text``:
TeX delimiters dropped, ``\\frac{a}{b}`` as ``a/b``, ``\\times`` as ``*``, ``\\text{...}`` and ``\\boxed{...}`` as
their contents, markdown bold and headings dropped; numbers and words kept), named ``<teacher>_plain``: whether the
style of the explanations (the teachers write TeX and markdown, the GSM-Symbolic worked solutions plain text) is
part of what they cost the solution's likelihood. For example

    **Step 1:** Olivia: \\( 3 \\times 91 = 273 \\).          Step 1: Olivia: 3 * 91 = 273.
    \\[ \\text{Total} = \\frac{1}{2} \\times 890 = \\boxed{445} \\]    becomes    Total = 1/2 * 890 = 445

``differences`` then also holds each ``<teacher>_plain - <teacher>``, paired on the same questions (the explanations as
kept are scored in the same run); the JSON records ``"rewrite": "plain"`` and, in ``rewritten``, what the rewrite
changed and an example.

Each reading also splits the solution's mean log-prob into its first OPENING tokens (how a solution opens after the
thought) and the rest (the steps).

The questions are a seeded sample of those every named teacher explained (``study_fair.py keep``'s folder),
stratified by template (``rlt_mono.data.rows.sample_rows``). The student and the reward settings come from the
``distill`` run config and its overrides, as the study's distill scored the rows; each teacher's rows, scored
again here, reproduce the distill's own ``r_ss`` to within the precision of the device (``reproduces``: each
teacher's mean and largest difference, a warning above REPRODUCE_TOLERANCE; only for the teachers whose distill
scored the same text, ``data.gsm_solution`` in the kept manifest: the answer-only teacher's distill scored the answer
line, the others the worked solution; none for a ``--rewrite`` reading, whose text the distill never scored). r_SS reads
the student's log-probs at the reward's temperature (``reward.unbias_student_log_probs_temp``, 0.7 in the RLT run),
as the reward does. Intervals: 95% bootstrap of the
paired mean difference, templates resampled, then questions within them.

``--kept`` loads no model: it compares the named teachers on the scores their distill recorded with each kept row
(``r_ss``, ``r_kl``, ``total``; and the shares that hold a wrong equation and that close within the cap), paired on
every question they all explained (``--questions 0``) or on a sample, with the same intervals; seconds on any
machine. Teachers whose distills scored different texts (the answer-only teacher beside the others) are refused:
their ``r_ss`` are not one quantity.

    python bench/explanation_value.py study_data/gsm_symbolic_v2/explanations --teachers sft,rl_s0 --questions 64 \\
        --out results/study_gsm_symbolic_v2/explanation_value.json student=qwen2.5_coder_0.5b_instruct
    python bench/explanation_value.py study_data/gsm_symbolic_v2/explanations --teachers sft,rl_s1 --questions 64 \\
        --rewrite plain --out results/study_gsm_symbolic_v2/explanation_value_plain.json \\
        student=qwen2.5_coder_0.5b_instruct student.dtype=float32 data=gsm_symbolic
    python bench/explanation_value.py study_data/gsm_symbolic_v2/explanations --teachers sft,rl_s1 --kept \\
        --questions 0 --out results/study_gsm_symbolic_v2/kept_scores_s1.json
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # rlt_mono, and the scripts beside this one however it was loaded

from bench_mono import code_commit  # noqa: E402
from study.kept import kept_solutions, read_kept  # noqa: E402
from study.layout import StudyError  # noqa: E402
from study.stats import _interval, _question_weights  # noqa: E402

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
# What --kept compares: the scores the distill wrote with each kept row, and the shares of kept explanations that
# hold a wrong equation (``wrong_equations`` > 0) and that close within the token cap (``matched``), where every
# row compared carries those fields.
KEPT_SCORES = ("r_ss", "r_kl", "total")
KEPT_SHARES = {"wrong_equation": "wrong_equations", "closes": "matched"}


# --rewrite plain: a teacher's explanation in plain text, as the GSM-Symbolic worked solutions are written (plain_text)
REWRITES = ("plain",)
# Commands whose one argument is kept, the command dropped: \text{ miles} -> " miles", \boxed{26} -> "26".
_UNWRAP = {"text", "textrm", "textbf", "textit", "textsf", "texttt", "emph", "mathrm", "mathbf", "mathit", "mathsf",
           "mathtt", "operatorname", "boxed", "mbox", "hbox"}
_FRACTIONS = {"frac", "dfrac", "tfrac"}
# Commands written as plain characters; \left, \right and any command not named here are dropped (\lfloor,
# \displaystyle), their arguments kept (a brace group is its contents).
_SYMBOLS = {"times": "*", "cdot": "*", "div": "/", "approx": "~", "pm": "+/-", "le": "<=", "leq": "<=", "ge": ">=",
            "geq": ">=", "ne": "!=", "neq": "!=", "ldots": "...", "cdots": "...", "dots": "...", "to": "->",
            "rightarrow": "->", "Rightarrow": "=>", "implies": "=>", "gets": "<-", "pi": "pi", "%": "%", "$": "$",
            "&": "&", "#": "#", "_": "_", "{": "{", "}": "}", ",": " ", ";": " ", ":": " ", " ": " ", "quad": " ",
            "qquad": " ", "!": "", "\\": "\n", "(": "", ")": "", "[": "", "]": ""}
_SIZES = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr"}
_CODE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)  # a fenced code block, kept as written
_DISPLAY_LINE = re.compile(r"^[ \t]*(?:\\\[|\\\]|\$\$)[ \t]*(?:\n|$)", re.MULTILINE)  # a line that is a delimiter
_INLINE_DOLLARS = re.compile(r"(?<![\\$])\$(?=[^\s$])([^$\n]*?[^\s$\\])\$(?![\d$])")  # $x$, not "$5 or $7"
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|(?<!\w)__(?=\S)(.+?)(?<=\S)__(?!\w)")
_ITALIC = re.compile(r"(?<![\w*\\])\*(?=[^\s*])([^*\n]*?[^\s*\\])\*(?![\w*])"
                     r"|(?<![\w\\])_(?=[^\s_])([^_\n]*?[^\s_\\])_(?!\w)")
_HEADING = re.compile(r"^([ \t]*)#{1,6}(?:[ \t]+|$)", re.MULTILINE)
_SIMPLE = re.compile(r"-?[\w.,%$€£]+")  # a fraction's part written without parentheses: one number or word


def plain_text(text: str) -> str:
    """``text`` (a teacher's explanation) rewritten into plain text, deterministically (``--rewrite plain``):

    - TeX: the math delimiters ``\\( \\) \\[ \\]``, ``$$`` and ``$...$`` dropped (a line holding only a display
      delimiter goes with its line break; a currency ``$5`` stays, ``\\$`` is ``$``); ``\\frac{a}{b}`` (``\\dfrac``,
      ``\\tfrac``) is ``a/b``, each part in parentheses unless it is one number or word (``\\frac{\\frac{1}{2}}{3}``
      is ``(1/2)/3``); ``\\times`` and ``\\cdot`` are ``*``, ``\\div`` ``/`` (and the few others of ``_SYMBOLS``:
      ``\\approx`` ``~``, ``\\le`` ``<=``, ...); ``\\text{...}``, ``\\mathrm{...}``, ``\\boxed{...}`` and the like
      are their contents, braces inside handled; ``\\left``/``\\right`` dropped; spacing (``\\,`` ``\\;``
      ``\\quad``) is a space, ``\\,`` between digits nothing; ``\\%`` is ``%``; any other command is dropped and a
      brace group is its contents (a brace anywhere outside a code block is read as TeX's).
    - Markdown: bold and italic markers (``**x**``, ``__x__``, ``*x*``, ``_x_``) and heading hashes dropped; a fenced
      code block (```` ``` ````) is kept as written (its ``#`` are comments, its ``*`` and ``_`` code).
    - Spaces: runs of spaces within a line are one, lines are stripped, a space before a closing ``.,;:!?`` (one
      followed by a space or the end) or ``)`` and after ``(`` dropped, at most one blank line in a row.

    Numbers and words are kept as written. For example ``**Step 1:** Olivia: \\( 3 \\times 91 = 273 \\).`` then
    ``\\[ \\text{Total} = \\frac{1}{2} \\times 890 = \\boxed{445} \\]`` on the next line becomes ``Step 1: Olivia:
    3 * 91 = 273.`` then ``Total = 1/2 * 890 = 445``."""
    parts, start = [], 0
    for block in _CODE.finditer(text):
        parts += [_plain_prose(text[start:block.start()]), block.group()]
        start = block.end()
    parts.append(_plain_prose(text[start:]))
    return re.sub(r"\n{3,}", "\n\n", "".join(parts)).strip()


def _plain_prose(text: str) -> str:
    """``plain_text`` of text outside code blocks."""
    text = _DISPLAY_LINE.sub("", text).replace("$$", "")
    text = _INLINE_DOLLARS.sub(r"\1", text)
    text = _BOLD.sub(lambda m: m.group(1) or m.group(2), text).replace("**", "")
    text = _ITALIC.sub(lambda m: m.group(1) or m.group(2), text)
    text = _HEADING.sub(r"\1", text)
    lines = []
    for line in _plain_tex(text).split("\n"):
        line = re.sub(r"[ \t]+", " ", line).strip()
        line = re.sub(r" +([.,;:!?])(?= |$)", r"\1", line)
        lines.append(re.sub(r"\( +", "(", re.sub(r" +\)", ")", line)))
    return "\n".join(lines)


def _command(text: str, i: int) -> tuple[str, int]:
    """The name of the TeX command whose backslash is at ``i`` (a run of letters, or the one character after it)
    and where the text after it starts."""
    name = re.match(r"[A-Za-z]+|.?", text[i + 1:], re.DOTALL).group()
    return name, i + 1 + len(name)


def _argument(text: str, i: int) -> tuple[str, int]:
    """A command's argument from ``i`` on (spaces skipped): a brace group's contents (nested braces and escaped
    ones counted), a command, or one character; and where the text after it starts."""
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text):
        return "", i
    if text[i] == "\\":
        _, end = _command(text, i)
        return text[i:end], end
    if text[i] != "{":
        return text[i], i + 1
    depth, j = 0, i
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j], j + 1
        j += 1
    return text[i + 1:], len(text)  # an unclosed group: the rest


def _fraction_part(text: str) -> str:
    part = text.strip()
    return part if _SIMPLE.fullmatch(part) else f"({part})"


def _plain_tex(text: str) -> str:
    """The TeX of ``plain_text`` rewritten, left to right."""
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "{":
            inner, i = _argument(text, i)
            out.append(_plain_tex(inner))
        elif char == "}":  # a brace closing no group: dropped
            i += 1
        elif char != "\\":
            out.append(char)
            i += 1
        else:
            name, i = _command(text, i)
            if name in _FRACTIONS:
                numerator, i = _argument(text, i)
                denominator, i = _argument(text, i)
                out.append(f"{_fraction_part(_plain_tex(numerator))}/{_fraction_part(_plain_tex(denominator))}")
            elif name in _UNWRAP:
                inner, i = _argument(text, i)
                out.append(_plain_tex(inner))
            elif name in _SIZES:
                if text[i:i + 1] == ".":  # \left. : no delimiter
                    i += 1
            elif name == "," and out and out[-1][-1:].isdigit() and text[i:i + 1].isdigit():
                pass  # 1\,000: a thousands space inside a number
            else:
                out.append(_SYMBOLS.get(name, ""))
    return "".join(out)


def teachers_rows(folder: Path, teachers: list[str]) -> dict[str, dict[str, dict]]:
    """``{teacher: {question_id: row}}`` of each named teacher kept in ``folder`` (``study.kept.read_kept``: each
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


def rewritten(teacher: str, rewrite: str) -> str:
    """The name of the reading of ``teacher``'s explanations rewritten by ``--rewrite`` (``sft_plain``)."""
    return f"{teacher}_{rewrite}"


def readings(questions: list[dict], rows: dict[str, dict[str, dict]], rewrite: str | None = None
             ) -> dict[str, list[str]]:
    """The explanation each reading puts in the student's thought, per question: none, each teacher's as kept, with
    ``rewrite`` each teacher's rewritten (``plain_text``, the reading ``rewritten(teacher, rewrite)``), and the worked
    solution."""
    out = {NONE: ["" for _ in questions]}
    for name, by_id in rows.items():
        out[name] = [by_id[q["question_id"]]["explanation"] for q in questions]
    if rewrite is not None:
        for name in rows:
            out[rewritten(name, rewrite)] = [plain_text(text) for text in out[name]]
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
    study's own resampling, ``study.stats._question_weights``)."""
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


def _kept_flag(row: dict, teacher: str, share: str) -> float:
    """1.0 or 0.0 for a kept row's KEPT_SHARES ``share``: ``wrong_equations`` a count (> 0: a wrong equation),
    ``matched`` a boolean."""
    field = KEPT_SHARES[share]
    value = row.get(field)
    valid = isinstance(value, bool) if field == "matched" else (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    if not valid:
        raise ConfigError(f"{teacher}: question {row.get('question_id')}: {field} is {value!r}, not "
                          f"{'true or false' if field == 'matched' else 'a count'}: --kept compares what the "
                          "distill wrote")
    return float(value > 0) if field == "wrong_equations" else float(value)


def kept_differences(rows: dict[str, dict[str, dict]], teachers: list[str], questions: list[dict],
                     rng: np.random.Generator) -> tuple[dict, dict]:
    """``(means, differences)`` of the distill's own KEPT_SCORES, and of KEPT_SHARES where every compared row
    carries its field: each teacher's mean per score (a share: the fraction of its rows), and per pair of teachers
    (later - earlier) the paired mean difference per score with its interval (``paired_interval``)."""
    templates = np.array([q["template"] for q in questions])
    values = {name: {key: np.array([_kept_score(rows[name][q["question_id"]], name, key) for q in questions])
                     for key in KEPT_SCORES} for name in teachers}
    for share, field in KEPT_SHARES.items():
        if all(field in rows[name][q["question_id"]] for name in teachers for q in questions):
            for name in teachers:
                values[name][share] = np.array([_kept_flag(rows[name][q["question_id"]], name, share)
                                                for q in questions])
    means = {name: {key: round(float(v.mean()), 4) for key, v in by_key.items()} for name, by_key in values.items()}
    differences = {}
    for i in range(len(teachers)):
        for j in range(i + 1, len(teachers)):
            a, b = teachers[j], teachers[i]
            differences[f"{a} - {b}"] = {}
            for key in values[a]:
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
    parser.add_argument("--rewrite", choices=REWRITES, default=None,
                        help="also score each teacher's explanations rewritten: plain, TeX and markdown as plain text")
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
        if args.kept and (len(teachers) < 2 or args.overrides or args.solution != "worked" or args.rewrite):
            raise ConfigError("--kept compares two or more kept teachers on their distill's scores: no overrides, "
                              "no --solution, no --rewrite")
        if args.rewrite and set(teachers) & {rewritten(name, args.rewrite) for name in teachers}:
            raise ConfigError(f"--teachers {args.teachers}: a teacher named as another's --rewrite {args.rewrite} "
                              "reading")
        rows = teachers_rows(args.folder, teachers)
        solved = kept_solutions(args.folder)
        solutions = {name: solved[name] for name in teachers}
        if args.kept and len(set(solutions.values())) > 1:
            raise ConfigError("--kept: " + ", ".join(f"{name}'s distill scored the {solution} solution"
                                                     for name, solution in solutions.items())
                              + ": their r_ss are not one quantity (without --kept every explanation is scored "
                                "again against one --solution)")
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
    texts = readings(questions, rows, args.rewrite)
    per_reading = {}
    for name, explanations in texts.items():
        logger.info("scoring %d questions, the student reading: %s", len(questions), name)
        per_reading[name] = score(reward, questions, explanations, args.solution)
    templates = np.array([q["template"] for q in questions])
    rng = np.random.default_rng(args.seed)
    # each teacher's rows as kept scored again against the distill's own r_ss, where the distill scored the same
    # solution (the answer-only teacher's distill scored the answer line); not the rewritten readings
    same_solution = [name for name in teachers if solutions[name] == args.solution]
    reproduces = {} if same_solution else None
    for name in same_solution:
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
        "rewrite": args.rewrite,
        **({"rewritten": rewrite_summary(args.rewrite, teachers, questions, texts)} if args.rewrite else {}),
        "per_question": [{"question_id": q["question_id"], "template": q["template"],
                          **{name: round(float(per_reading[name][0][i]), 4) for name in per_reading}}
                         for i, q in enumerate(questions)],
        "commit": commit, "device": torch.cuda.get_device_name() if device == "cuda" else
        f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "command": command, "seconds": round(time.perf_counter() - started, 1)}
    groups = [teachers] + ([[rewritten(name, args.rewrite) for name in teachers]] if args.rewrite else [])
    explained = [name for group in groups for name in group]
    pairs = [(name, NONE) for name in [*explained, WORKED]] + [(WORKED, name) for name in explained]
    pairs += [(group[j], group[i]) for group in groups for i in range(len(group)) for j in range(i + 1, len(group))]
    if args.rewrite:  # each teacher's rewritten explanations against its own as kept, on the same questions
        pairs += [(rewritten(name, args.rewrite), name) for name in teachers]
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


def rewrite_summary(rewrite: str, teachers: list[str], questions: list[dict], texts: dict[str, list[str]]) -> dict:
    """What ``--rewrite`` did, for the JSON: each rewritten reading's teacher, how many explanations it changed and
    their mean length before and after, and one example: the first paragraph of the first teacher's explanations (in
    question order) that writes TeX in at most 400 characters, as kept and rewritten."""
    first = teachers[0]
    example = next(((q["question_id"], part) for q, text in zip(questions, texts[first])
                    for part in text.split("\n\n") if "\\" in part and len(part) <= 400),
                   (questions[0]["question_id"], texts[first][0][:400]))
    return {"readings": {rewritten(name, rewrite): name for name in teachers},
            "reproduces": "not checked for the rewritten readings: the distill scored the explanations as kept, "
                          "never their rewritten text",
            "changed": {name: sum(a != b for a, b in zip(texts[name], texts[rewritten(name, rewrite)]))
                        for name in teachers},
            "mean_chars": {name: {"kept": round(float(np.mean([len(t) for t in texts[name]])), 1),
                                  rewrite: round(float(np.mean([len(t) for t in texts[rewritten(name, rewrite)]])),
                                                 1)} for name in teachers},
            "example": {"teacher": first, "question_id": example[0], "kept": example[1],
                        rewrite: plain_text(example[1])}}


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
