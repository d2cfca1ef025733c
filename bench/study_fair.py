"""The fair study's summary (docs/STUDY.md): every arm's held-out accuracy with intervals over seeds, templates and
questions, the positive control, and the paired differences, from the eval folders bench/study_fair.sh writes.

    python bench/study_fair.py export <root> --out study_data/gsm_symbolic_v2/answers [--suffix _lr1e-5] \
        --device H200 --commit <sha> --command "<how it ran>"
    python bench/study_fair.py summarize study_data/gsm_symbolic_v2/answers --out results/study_gsm_symbolic_v2 \
        --teachers <teachers files> --explanations study_data/gsm_symbolic_v2/explanations \
        --traces study_data/gsm_symbolic_v2/traces.jsonl.gz
    python bench/study_fair.py traces <root>/traces/eval --out <root>/traces/traces.jsonl
    python bench/study_fair.py teachers <root> --out results/study_gsm_symbolic_v2/teachers.json \
        --device H200 --commit <sha> --command "<how it ran>"
    python bench/study_fair.py common <root> --out <folder of the students' distilled files>
    python bench/study_fair.py keep <root> --out study_data/gsm_symbolic_v2/explanations [--replace]
    python bench/study_fair.py restore study_data/gsm_symbolic_v2/explanations --out <folder of the students' files>
    python bench/study_fair.py check-distilled <kept folder> <root>/distilled [--own <root>/teachers] [--students]
    python bench/study_fair.py teachers-plot results/study_gsm_symbolic_v2/teachers_cap512_*.json --out <png>
    python bench/study_fair.py worked-target <root>/distilled/rl_answer_s0.jsonl --out <rows file>
    python bench/study_fair.py rounded study_data/gsm_symbolic_v2/explanations

A root holds ``<student>/<arm>[_s<seed>]/eval/eval_rows.jsonl`` (one line per held-out question: ``heldout`` set,
``template``, ``correct``, ``capped``, ``student_output``). ``export`` keeps of each what the summary needs, in a
few kilobytes (``<student>/<arm><suffix>_s<seed>.json``: question hashes, sets, templates, right/wrong, cut at the
cap, whether the answer loops (``looped``), where it ran, and for a trained student the name and sha256 of the
file it was trained on, ``trained_on``), so the study's summary is recomputed from committed
files as its parts are run at different times. An arm's accuracy on a held-out set is the mean over its seeds of the
mean over questions. Its interval is a percentile bootstrap that resamples, in turn, seeds (with replacement),
templates (clusters: the questions of one template share wording and method) and questions within each drawn
template. A difference between two arms of one student resamples the same templates and questions for both (paired
over questions) and each arm's seeds apart. Writes ``study.json``, ``study_table.md`` and ``study.png`` into
``--out``.

``teachers`` keeps of the teachers part's runs (``<root>/teachers``) what the study reports, in a few kilobytes:
per RL teacher that saved its trained teacher (its ``final/``, or where an archive left that out, its README.md
saying the teacher is in ``final/``; a run stopped by ``trainer.max_minutes`` counts) its held-out reward curve,
optimizer steps of ``max_steps`` and whether the time limit stopped it, completions, median seconds per step by
phase, reward setting and seed; the SFT teacher's steps and held-out loss (first -> best); per distill its rows,
mean kept reward and whether it is ``complete`` (a distill that never logged its end line is kept as partial: its
rows are the questions it explained). Its ``common`` block holds the questions every distill of the root explained
(``teachers/distill_<name>/distill.jsonl``, else ``distilled/<name>.jsonl``), their templates, and per distill the
mean reward and its parts, the share matched, the share with wrong equations and the mean explanation length over
those questions alone: the teachers compared on the same questions. A file already there is merged into: a machine
adds its teachers, and a teacher already in the file must read the same (a teacher is added once); the common block
is replaced by the one of the root read last. ``summarize`` reads it (``--teachers``, by default ``teachers.json``
in ``--out``; or one file per teachers part, merged, a later file's teacher of a name kept; with ``--explanations``,
``keep``'s folder, the common block comes from the kept rows the students read, and a taught run whose
``trained_on`` is not its teacher's kept rows, or says nothing, is refused: ``check_read_kept``) for each student's
``correlation``: the teachers' reward against the accuracy of the students they taught, one point per teacher
(``correlation_points``), Pearson's r and Spearman's rho per held-out set, with a percentile-bootstrap interval over
the points. The teacher's reward is its distill's mean reward on the common
questions where the file has a common block, else its held-out reward (the correlation's ``x`` says which).

``common`` writes, for every distill of a root, ``<out>/<name>.jsonl.gz``: its rows of the questions every distill
explained, so that each taught arm trains on the same questions: each row with its ``question_id`` first, sorted by
it (the same order in every file, whatever order the distills wrote). ``keep`` keeps those rows in the
repository, where they outlast the machine that trained the students: ``<out>/<name>.jsonl.xz`` per distill and
``<out>/manifest.json`` (rows, the sha256 of the uncompressed rows, and where the root records them the teacher, the
study's commit and command, and the configs of the teacher's training and of its distill); a distill kept already
with other rows is refused unless ``--replace``. ``restore`` writes ``common``'s files from them, byte for byte
(bench/study_fair.sh's students part does, when its distilled folder is empty).

``traces`` makes the larger-model traces (the analog of the RLT paper's larger-model thoughts: the teacher's SFT
warm-up data and the traces student arm) from an eval folder run with ``eval.split=train`` and
``eval.student_prompt=plain``: one line per training question the model answered right within the token cap, with
``trace``, its answer less everything from its last "The answer is" on (the worked solution states the answer)
and the markup opening that sentence.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import logging
import lzma
import re
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from rlt_mono.errors import UserError
from rlt_mono.read_source import module_constant
from rlt_mono.runs.atomic_write import write_bytes, write_json, write_text
from rlt_mono.runs.outputs import (
    CONFIG_FILE,
    EVAL_EVENT,
    METRICS_FILE,
    README_FILE,
    SUMMARY_EVENT,
    in_phase_order,
    is_number,
    read_metrics,
)
from rlt_mono.study.aggregate import pearson
from rlt_mono.study.eval_stats import RESAMPLES

logger = logging.getLogger("study_fair")

SETS = {"instances": "held_out_instances", "templates": "held_out_templates"}
SHORT_SETS = {name[0]: name for name in SETS}  # export writes each row's set as its first letter
# The positive control: students trained on the dataset's own worked solutions against the better untrained prompt,
# on held-out instances of the training templates, must gain at least this much with the interval above zero.
CONTROL_ARM, UNTRAINED_ARMS, CONTROL_MARGIN = "worked", ("untrained", "untrained_plain"), 0.05
# An answer cut at the token cap is graded on its text like any other, and is mostly wrong (it seldom reaches its
# final line). Where an arm's answers are cut more often than this on a held-out set, a difference with it is also
# given on the questions no seed of either arm cut (``uncut``), and the table says so: the cap may be part of what
# the difference measures. That subset is picked by the arms' own outputs (how long they write): a conditional
# comparison that locates a difference, not a cause.
CAP_BAR = 0.05
# The comparisons the study exists for, each as (arm, minus arm), per student, wherever both arms were run.
# worked_common: the worked solutions alone on the teachers' questions (the teacher arms' like-for-like control).
DIFFERENCES = (("worked", "untrained"), ("worked", "untrained_plain"), ("worked_common", "untrained_plain"),
               ("rl_teacher", "sft_teacher"),
               ("rl_teacher", "worked"), ("sft_teacher", "worked"), ("rl_teacher", "worked_common"),
               ("sft_teacher", "worked_common"),
               ("rl_teacher", "traces"), ("rl_teacher", "rl_teacher_answer_only"))
# Student's t, the two-sided 95% quantile for 1-30 degrees of freedom (the standard table); past 30, 30's, which
# widens the interval a little (``seed_t_interval``).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_SEEDED = re.compile(r"^(?P<arm>.+)_s(?P<seed>\d+)$")
# The sentence a plain-prompt answer ends with (rlt_mono.stages.eval), the markup that may open it on its line, and
# what a traces eval must have been run with.
THE_ANSWER_IS = module_constant("rlt_mono.stages.eval", "THE_ANSWER_IS")
_SENTENCE_MARKUP = re.compile(r"[ \t*#_>-]*\Z")
TRACES_EVAL = {"eval.split": "train", "eval.student_prompt": "plain"}
# A trace line's columns: the row's own, then the trace.
TRACE_COLUMNS = ("question", "solution", "answer", "template")
# The study table's arm order: these first, then rl_teacher_step<N> by N, then any other arm by name.
ARM_ORDER = ("untrained", "untrained_plain", "worked", "worked_common", "traces", "sft_teacher", "rl_teacher",
             "rl_teacher_answer_only")
_STEP_ARM = re.compile(r"^rl_teacher_step(?P<step>\d+)$")
# The SFT teacher's explanations sampled with distill seed s (bench/study_fair.sh's STUDY_SFT_SEEDS), which its
# students of seed s read: the distill's name, and how to know one.
SFT_SAMPLE = "sft_s{seed}"
_SFT_SAMPLE = re.compile(r"^sft_s\d+$")
# A distill's teacher that is an RL run's checkpoint (``below_teachers``): rl_s0/rl/checkpoint-30.
_CHECKPOINT_TEACHER = re.compile(r"^(?P<run>[^/]+)/rl/checkpoint-(?P<step>\d+)$")
# What the teachers part of bench/study_fair.sh leaves under <root>/teachers: the SFT teacher's folder, each RL
# teacher's run folder teachers/<name>/rl (rl_s<seed>, rl_answer_s<seed>), each distill's folder and its log.
SFT_SUMMARY_FILE = module_constant("rlt_mono.stages.sft", "SUMMARY_FILE")
DISTILL_FILE = module_constant("rlt_mono.stages.distill", "DISTILL_FILE")
# The line a distill logs when it ends (rlt_mono.stages.distill): questions written, where, and its phases' seconds.
_DISTILL_DONE = re.compile(r"distill: wrote \d+ questions to .+ \((?P<phases>[^()]*)\)\s*$")
_PHASE_SECONDS = re.compile(r"^phase/(?P<phase>[^/]+)/seconds$")
# The "steps done" line of an RL run's README.md (rlt_mono.runs.readme) when the run saved its trained teacher (it
# finished, or trainer.max_minutes stopped it): it says so where the archive of a run leaves final/ out.
_TEACHER_SAVED = re.compile(r"^\|\s*steps done\s*\|.*the trained teacher is in `final/`", re.MULTILINE)
# Where the teachers part leaves each distill's rows: teachers/distill_<name>/distill.jsonl, copied to
# distilled/<name>.jsonl (the file read when the first is not there).
DISTILLED_FOLDER = "distilled"
TEACHERS_FILE = "teachers.json"
# The students' files (common, restore) and the repository's copy of them (keep): per distill <name>.jsonl.gz,
# <name>.jsonl.xz and one manifest.json.
STUDENTS_SUFFIX, KEPT_SUFFIX, MANIFEST_FILE = ".jsonl.gz", ".jsonl.xz", "manifest.json"
ANSWER_ONLY_TEACHER = "rl_answer_s0"  # the answer-only reward's RL teacher, which rl_teacher_answer_only reads
# The correlation: no figure under MIN_POINTS points, no interval under INTERVAL_POINTS.
CORRELATION_MIN_POINTS, CORRELATION_INTERVAL_POINTS = 3, 4
# The correlation's teacher reward without a common block in the teachers file.
HELD_OUT_X = "the teacher's held-out reward (eval_reward)"
# The worked-solution reward the RL teachers are trained and measured with (data.gsm_solution).
WORKED_REWARD = "worked"
CORRELATION_LEFT_OUT = {
    "rl_teacher_answer_only": "its teacher's held-out reward scores the student's likelihood of the answer line "
                              "alone (data.gsm_solution=answer), a different quantity from the worked-solution "
                              "reward of the other teachers"}


# An answer loops when its last LOOP_TAIL_CHARS characters (trailing space dropped) occur LOOP_TIMES times or more in
# it: a student that repeats itself until the cap (a line, a block of lines or a phrase inside one line), which a
# larger cap does not help. An answer that ends normally ("The answer is 7.") does not repeat its ending, and a list
# whose items repeat a fact line does not end on a repeat unless it is still repeating.
LOOP_TAIL_CHARS, LOOP_TIMES = 40, 4


def looped(answer: str) -> bool:
    """Whether ``answer``'s last ``LOOP_TAIL_CHARS`` characters occur ``LOOP_TIMES`` times or more in it (counted
    where they overlap, too: a loop shorter than the ending repeats it at each turn)."""
    answer = answer.rstrip()
    tail = answer[-LOOP_TAIL_CHARS:]
    if len(tail) < LOOP_TAIL_CHARS:
        return False
    found, start = 0, answer.find(tail)
    while start != -1 and found < LOOP_TIMES:
        found, start = found + 1, answer.find(tail, start + 1)
    return found >= LOOP_TIMES


class StudyError(ValueError):
    """What the user must fix: one line."""


def _question_id(question: str) -> str:
    return hashlib.sha256(" ".join(question.split()).encode()).hexdigest()[:12]


def _eval_folders(root: Path) -> list[tuple[str, str, int, Path]]:
    """``(student, arm, seed, eval folder)`` of every eval folder under ``root`` that wrote its rows (unread)."""
    folders = []
    for rows_file in sorted(root.glob("*/*/eval/eval_rows.jsonl")):
        run = rows_file.parent.parent
        match = _SEEDED.match(run.name)
        arm, seed = (match["arm"], int(match["seed"])) if match else (run.name, 0)
        folders.append((run.parent.name, arm, seed, rows_file.parent))
    return folders


def _finished_eval_folders(root: Path) -> list[tuple[str, str, int, Path]]:
    """``_eval_folders`` whose eval wrote its summary (``eval.json``) after its rows, as ``_eval_runs`` takes them."""
    return [entry for entry in _eval_folders(root) if (entry[3] / "eval.json").is_file()]


def _eval_runs(root: Path) -> list[tuple[str, str, int, list[dict], Path]]:
    """``(student, arm, seed, rows, eval folder)`` of every eval folder under ``root``, each row keyed by its
    question's id."""
    runs = []
    for student, arm, seed, folder in _eval_folders(root):
        rows_file = folder / "eval_rows.jsonl"
        rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
        if not rows:
            raise StudyError(f"{rows_file} is empty: that eval did not finish; run its part again")
        if not (folder / "eval.json").is_file():  # its rows are written, its summary not yet
            logger.warning("%s: no eval.json beside its rows yet (the eval is ending): left out", folder)
            continue
        runs.append((student, arm, seed, [{**row, "question": _question_id(row["question"]),
                                           "looped": looped(row.get("student_output") or "")}
                                          for row in rows], folder))
    return runs


def _exported_runs(root: Path) -> list[tuple[str, str, int, list[dict]]]:
    """The same from ``export``'s files under ``root``."""
    runs = []
    for path in sorted(root.glob("*/*.json")):
        match = _SEEDED.match(path.stem)
        if match is None:
            continue
        saved = json.loads(path.read_text())
        loops = saved.get("looped") or [None] * len(saved["question"])  # exports before it kept no loop bit
        rows = [{"question": q, "heldout": SHORT_SETS[h], "template": t, "correct": c == "1", "capped": x == "1",
                 "looped": None if loop is None else loop == "1"}
                for q, h, t, c, x, loop in zip(saved["question"], saved["heldout"], saved["template"],
                                               saved["correct"], saved["capped"], loops, strict=True)]
        runs.append((path.parent.name, match["arm"], int(match["seed"]), rows))
    return runs


def is_answered(answers: Path, student: str, label: str, commit: str | None) -> bool:
    """Whether ``answers/<student>/<label>.json`` (``export``'s file of that run, e.g. ``rl_teacher_s0``) is there,
    and, given ``commit``, was run at that commit (either id may be the other's short form)."""
    path = answers / student / f"{label}.json"
    if not path.is_file():
        return False
    if commit is None:
        return True
    saved = str(json.loads(path.read_text()).get("commit", ""))
    return bool(saved) and (saved.startswith(commit) or commit.startswith(saved))


def read_arms(roots: list[Path]) -> dict[str, dict[str, dict[int, list[dict]]]]:
    """``{student: {arm: {seed: eval rows}}}`` from every ``<root>/<student>/<arm>[_s<seed>]/eval`` and every
    exported ``<root>/<student>/<arm>_s<seed>.json``."""
    arms: dict[str, dict[str, dict[int, list[dict]]]] = {}
    for root in roots:
        for student, arm, seed, rows, *_ in [*_eval_runs(root), *_exported_runs(root)]:
            seeds = arms.setdefault(student, {}).setdefault(arm, {})
            if seed in seeds:
                raise StudyError(f"{root}: {student}/{arm} seed {seed} is there twice; pass each run once")
            seeds[seed] = rows
    if not arms:
        raise StudyError(f"no <student>/<arm>/eval/eval_rows.jsonl under {', '.join(map(str, roots))}: pass the "
                         "folder bench/study_fair.sh wrote")
    return arms


def _kept_teacher(arm: str, seed: int, distills: frozenset[str] | set[str] = frozenset()) -> str | None:
    """The kept teacher (``keep``'s name) whose rows a taught arm's students of ``seed`` read: the distill
    ``_arm_distill`` names, and for the two arms that are no correlation point, worked_common (its questions' worked
    solutions) -> sft and rl_teacher_answer_only -> rl_answer_s0; None for an arm that reads no teacher's rows."""
    if arm == "worked_common":
        return "sft"
    if arm == "rl_teacher_answer_only":
        return ANSWER_ONLY_TEACHER
    named = _arm_distill(arm, seed, distills)
    return None if named is None else named[1]


def _runs_trained_on(roots: list[Path]) -> list[tuple[str, str, int, dict | None]]:
    """``(student, arm, seed, trained_on)`` of every run under ``roots``, eval folders (``_finished_eval_folders``,
    their rows unread) and exported files alike (``trained_on`` None where the run does
    not say)."""
    runs = []
    for root in roots:
        for student, arm, seed, folder in _finished_eval_folders(root):
            runs.append((student, arm, seed, trained_on(folder)))
        for path in sorted(root.glob("*/*.json")):
            if match := _SEEDED.match(path.stem):
                runs.append((path.parent.name, match["arm"], int(match["seed"]),
                             json.loads(path.read_text()).get("trained_on")))
    return runs


def worked_target(lines: list[str]) -> list[str]:
    """The answer-only teacher's rows (``rl_answer_s0``) with the worked solution as its students' target: each
    row's ``solution``, its answer line ("The answer is N."), after the row's steps (``reasoning_trace``), which is the
    worked-solution mapping's ``solution`` (rlt_mono.data.gsm_symbolic), the rest of the row as it was. Its
    students then learn its explanation + the worked solution, as every other taught arm's do, so that the arm
    differs from ``rl_teacher`` in its teacher alone (shown the answer, rewarded on it), not in what the student
    learns to write after the explanation."""
    out = []
    for number, line in enumerate(lines, 1):
        row = json.loads(line)
        if row.get("solution") != f"The answer is {row.get('answer')}." or not row.get("reasoning_trace"):
            raise StudyError(f"row {number}: not an answer-only row (a solution \"The answer is <answer>.\" and "
                             f"its steps in reasoning_trace): {line[:120]}")
        row["solution"] = f"{row['reasoning_trace']}\n{row['solution']}"
        out.append(json.dumps(row, ensure_ascii=False))
    return out


def _kept_digests(explanations: Path) -> dict[str, set[str]]:
    """Per teacher ``keep`` kept in ``explanations``, the sha256 of the rows a student may have read of it: its whole
    file (the manifest's) and its rows of the questions every kept teacher explained (what ``restore`` writes, and
    the questions the summary's common block covers; the same where every teacher explained the same questions)."""
    rows = read_kept(explanations)
    common = _questions_in_all(rows)
    digests = {}
    for name, pairs in rows.items():
        read = [[line for line, _ in pairs], [line for line, row in pairs if row["question"] in common]]
        if name == ANSWER_ONLY_TEACHER:  # its students read its rows with the worked solutions (worked_target)
            read += [worked_target(lines) for lines in read]
        digests[name] = {_sha256(_text(lines)) for lines in read}
    return digests


def _misread_runs(roots: list[Path], expected) -> tuple[list[str], list[str]]:
    """The runs under ``roots`` that read other rows than ``expected(arm, seed)`` allows (``(sha256s, note)``, None for
    a run it does not check), as ``<student>/<arm>_s<seed> (<file><note>)``, and those whose ``trained_on`` records
    no sha256 (it cannot be checked), as ``<student>/<arm>_s<seed>``."""
    other, unsaid = [], []
    for student, arm, seed, taught in _runs_trained_on(roots):
        allowed = expected(arm, seed)
        if allowed is None:
            continue
        label = f"{student}/{arm}_s{seed}"
        if not taught or not taught.get("sha256"):
            unsaid.append(label)
        elif taught["sha256"] not in allowed[0]:
            other.append(f"{label} ({taught.get('file')}{allowed[1]})")
    return other, unsaid


def check_read_kept(roots: list[Path], explanations: Path) -> None:
    """Every taught run read the rows ``explanations`` keeps of its teacher (the sha256 its ``trained_on`` records
    against ``_kept_digests``: the kept file's, or that of the rows ``restore`` writes of it): the correlation pairs
    each student with its teacher's reward on those rows, so a student taught by other explanations (an earlier
    part's teachers, say) is refused, naming the runs; so is one that does not record what it read (exported before
    ``trained_on``, or its file gone when it was exported): the answers of students taught by explanations no longer
    kept (the 2026-11-28 teachers') are such runs, and would otherwise enter the summary beside the new ones."""
    kept = _kept_digests(explanations)

    def expected(arm: str, seed: int) -> tuple[set[str], str] | None:
        teacher = _kept_teacher(arm, seed, set(kept))
        return None if teacher is None else (kept.get(teacher, set()), f", not the kept {teacher}")

    other, unsaid = _misread_runs(roots, expected)
    if other:
        raise StudyError(f"--explanations {explanations}: {len(other)} run(s) read other rows than the kept "
                         f"teacher's: {', '.join(other)}; summarize them without --explanations, or run them again")
    if unsaid:
        raise StudyError(f"--explanations {explanations}: {len(unsaid)} run(s) do not record what they were trained "
                         f"on, so whether they read the kept rows cannot be checked: {', '.join(unsaid)}; summarize "
                         "them without --explanations, or run them again")


def check_read_traces(roots: list[Path], traces: Path) -> None:
    """Every ``traces`` run read the committed traces (``traces``: the gzipped file bench/study_fair.sh unpacks,
    study_data/gsm_symbolic_v2/traces.jsonl.gz): the sha256 its ``trained_on`` records against that of the
    unpacked rows. A run taught by other traces, or that does not say what it read, is refused, naming the runs."""
    try:
        digest = _sha256(gzip.decompress(traces.read_bytes()))
    except (OSError, EOFError) as err:
        raise StudyError(f"--traces {traces}: not a readable gzip file of the traces ({err})") from err
    other, unsaid = _misread_runs(roots, lambda arm, seed: ({digest}, "") if arm == "traces" else None)
    if other or unsaid:
        raise StudyError(f"--traces {traces}: " + "; ".join(
            [f"{len(other)} run(s) read other traces: {', '.join(other)}"] * bool(other)
            + [f"{len(unsaid)} run(s) do not record what they were trained on: {', '.join(unsaid)}"] * bool(unsaid))
            + "; summarize them without --traces, or run them again")


def provenance(roots: list[Path]) -> list[dict]:
    """Where each run ran: ``student``, ``arm``, ``seed``, ``device``, ``commit``, ``command``: an exported run's as
    its file says; an eval folder's (a study root summarized as it is) the root's ``commit``, its own ``command``
    (else the root's) and ``device`` "?" (an eval folder does not record it), "?" for what is not there."""
    runs = []
    for root in roots:
        for student, arm, seed, folder in _finished_eval_folders(root):
            runs.append({"student": student, "arm": arm, "seed": seed, "device": "?",
                         "commit": _root_file(root, "commit") or "?",
                         "command": _root_file(folder, "command") or _root_file(root, "command") or "?"})
        for path in sorted(root.glob("*/*.json")):
            match = _SEEDED.match(path.stem)
            if match:
                saved = json.loads(path.read_text())
                runs.append({"student": path.parent.name, "arm": match["arm"], "seed": int(match["seed"]),
                             **{key: saved.get(key, "?") for key in ("device", "commit", "command")}})
    return runs


def trained_on(eval_folder: Path) -> dict | None:
    """What the student of an eval run was trained on: its SFT run's (``<run>/sft/config.yaml``) ``data.source``
    file's name and the sha256 of its bytes (``keep``'s manifest gives the same of each kept teacher's rows); the
    sha256 None where that file is gone, or ``data.source`` names a dataset, not a file. None for an untrained
    student (no SFT run)."""
    config = _config(eval_folder.parent / "sft" / "config.yaml")
    if config is None:
        return None
    source = str((config.get("data") or {}).get("source") or "")
    path = Path(source)
    if not source or path.suffix != ".jsonl":
        return {"file": source or None, "sha256": None}
    return {"file": path.name, "sha256": _sha256(path.read_bytes()) if path.is_file() else None}


def export(root: Path, out: Path, suffix: str, where: dict) -> list[Path]:
    """Each eval run under ``root`` as ``out/<student>/<arm><suffix>_s<seed>.json``; refuses to overwrite one. A run
    whose eval folder keeps the command that started it (``command``, bench/study_fair.sh) is exported with that
    command rather than ``where``'s: one root may hold the runs of several commands. A trained student's file says
    what it was trained on (``trained_on``)."""
    written = []
    for student, arm, seed, rows, folder in _eval_runs(root):
        own = folder / "command"
        run_where = {**where, "command": own.read_text().strip()} if own.is_file() else where
        taught = trained_on(folder)
        if taught is not None:
            run_where = {**run_where, "trained_on": taught}
        rows = [row for row in rows if row.get("heldout") in SETS and row.get("correct") is not None]
        path = out / student / f"{arm}{suffix}_s{seed}.json"
        if path.exists():
            raise StudyError(f"{path} exists: a run is exported once (choose another --suffix, or delete it)")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {
            **run_where, "question": [row["question"] for row in rows],
            "heldout": "".join(row["heldout"][0] for row in rows), "template": [row.get("template") for row in rows],
            "correct": "".join("1" if row["correct"] else "0" for row in rows),
            "capped": "".join("1" if row.get("capped") else "0" for row in rows),
            "looped": "".join("1" if row["looped"] else "0" for row in rows)}, indent=None)
        written.append(path)
    if not written:
        raise StudyError(f"no <student>/<arm>/eval/eval_rows.jsonl under {root}: pass the folder bench/study_fair.sh "
                         "wrote")
    return written


def trace_text(output: str) -> str:
    """A right answer as a trace: everything before its last "The answer is" (all of it where there is none), less
    the markup that opens that sentence on its line (``**``, ``#``, a bullet)."""
    return _SENTENCE_MARKUP.sub("", output.rsplit(THE_ANSWER_IS, 1)[0]).strip()


def traces(folder: Path, out: Path) -> tuple[int, int]:
    """``out``: one JSON line per row of the eval folder answered right and not cut at the cap, with a non-empty
    ``trace_text``; returns ``(kept, answered)``."""
    config = folder / "config.yaml"
    if not config.is_file() or not (folder / "eval_rows.jsonl").is_file():
        raise StudyError(f"{folder}: no config.yaml and eval_rows.jsonl here; pass the eval folder of the traces part")
    cfg = OmegaConf.load(config)
    for key, value in TRACES_EVAL.items():
        if OmegaConf.select(cfg, key) != value:
            raise StudyError(f"{folder} was run with {key}={OmegaConf.select(cfg, key)}: traces come from an eval "
                             f"with {', '.join(f'{k}={v}' for k, v in TRACES_EVAL.items())}")
    rows = [json.loads(line) for line in (folder / "eval_rows.jsonl").read_text().splitlines() if line.strip()]
    kept = [{**{key: row[key] for key in TRACE_COLUMNS if key in row}, "trace": trace_text(row["student_output"])}
            for row in rows if row.get("correct") and not row.get("capped")]
    kept = [row for row in kept if row["trace"]]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, "".join(json.dumps(row) + "\n" for row in kept))
    return len(kept), len(rows)


def _jsonl_lines(path: Path) -> list[tuple[str, dict]]:
    """``(line, row)`` of each non-empty line of a JSON-lines file."""
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            pairs.append((line, json.loads(line)))
        except json.JSONDecodeError as err:
            raise StudyError(f"{path}, line {number}: not a JSON row ({err.msg})") from err
    return pairs


def _jsonl(path: Path) -> list[dict]:
    return [row for _, row in _jsonl_lines(path)]


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 3) if values else None


def _mean(values: list[float]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


# The parts of the RLT reward an RL teacher's held-out evaluations log (eval_teacher_reward/<part>,
# rlt_mono.rewards.teacher_kl): reward = r_ss - r_kl + match_penalty (docs/METHOD.md, "The reward").
RLT_PARTS = ("r_ss", "r_kl", "match_penalty")


# What an RL teacher's training steps log, summed up as the mean of its first and last 10 steps: the reward, its
# parts, the share of explanations that never closed (cut at the cap) and the completions' mean length in tokens.
TRAIN_FIGURES = {"reward": "reward", **{part: f"teacher_reward/{part}" for part in RLT_PARTS},
                 "unmatched_frac": "alignment/unmatched_frac", "mean_length": "completions/mean_length"}


def _train_means(steps: list[dict], parts: list[list[dict]]) -> dict[str, list[float | None]]:
    """Each TRAIN_FIGURES figure some step logs: its mean over each of ``parts`` (slices of ``steps``)."""
    return {name: [_mean([row[key] for row in part if is_number(row.get(key))]) for part in parts]
            for name, key in TRAIN_FIGURES.items() if any(is_number(row.get(key)) for row in steps)}


def _eval_curve(evals: list[dict], key: str) -> list[list]:
    """``[[step, value], ...]`` of ``key`` over the evaluation rows that log it as a number (4 decimals)."""
    return [[int(row["step"]), round(float(row[key]), 4)] for row in evals if is_number(row.get(key))]


def rl_teacher_summary(folder: Path) -> dict:
    """An RL teacher's run folder (``metrics.jsonl``, ``config.yaml``) in a few numbers: ``seed``,
    ``reward_setting`` (``data.gsm_solution``), optimizer ``steps`` (the end-of-training row's, else the last logged
    step's), ``completions`` trained on (no row logs a count: steps x ``completions_per_step``, which is
    ``per_device_train_batch_size x gradient_accumulation_steps`` of the config, on one GPU), the configured
    ``generation_batch`` (``per_device_train_batch_size x steps_per_generation``; TRL's default for a null
    ``steps_per_generation`` is the accumulation), ``median_seconds_per_step`` of each phase over the logged steps,
    the held-out ``eval_reward_curve`` ``[[step, eval_reward], ...]`` and its parts' (``eval_reward_parts``:
    ``r_ss``, ``r_kl`` and ``match_penalty``, each ``[[step, value], ...]``, RLT_PARTS; they show which part RL
    raised), the mean of the first and the last 10 steps' figures (``first_last_10``, TRAIN_FIGURES) and of each
    10 steps in turn (``by_10_steps``: whether the training reward still rose when the run stopped), the median
    ``step_time`` and the highest device memory any phase logged (``peak_device_gib``), the ``checkpoints`` in the
    folder (``read_teachers`` adds those a distill explained with, whose folders an archive leaves out), the
    configured
    ``max_steps`` and ``stopped_by_time_limit``: fewer steps than ``max_steps`` with ``trainer.max_minutes`` set
    (above 0)."""
    cfg = OmegaConf.load(folder / CONFIG_FILE)
    metrics = folder / METRICS_FILE
    steps, evals = read_metrics(metrics), read_metrics(metrics, EVAL_EVENT)
    ends = read_metrics(metrics, SUMMARY_EVENT)
    optimizer_steps = int(ends[-1]["step"] if ends else max((row["step"] for row in steps), default=0))
    batch, accumulation = cfg.trainer.per_device_train_batch_size, cfg.trainer.gradient_accumulation_steps
    per_step = batch * accumulation
    phases = {match["phase"] for row in steps for key in row if (match := _PHASE_SECONDS.match(key))}
    max_steps, max_minutes = OmegaConf.select(cfg, "trainer.max_steps"), OmegaConf.select(cfg, "trainer.max_minutes")
    stopped = (is_number(max_steps) and optimizer_steps < max_steps and is_number(max_minutes) and max_minutes > 0)
    return {
        "seed": int(cfg.seed), "reward_setting": OmegaConf.select(cfg, "data.gsm_solution"),
        "steps": optimizer_steps, "max_steps": max_steps, "stopped_by_time_limit": bool(stopped),
        "completions": optimizer_steps * per_step, "completions_per_step": per_step,
        "generation_batch": batch * (cfg.trainer.steps_per_generation or accumulation),
        "median_seconds_per_step": {phase: _median([row[f"phase/{phase}/seconds"] for row in steps
                                                    if is_number(row.get(f"phase/{phase}/seconds"))])
                                    for phase in in_phase_order(phases)},
        "median_step_seconds": _median([row["step_time"] for row in steps if is_number(row.get("step_time"))]),
        "peak_device_gib": max((round(float(row[key]), 2) for row in steps for key in row
                                if key.endswith("/device_peak_gib") and is_number(row[key])), default=None),
        "first_last_10": _train_means(steps, [steps[:10], steps[-10:]]),
        "by_10_steps": _train_means(steps, [steps[i:i + 10] for i in range(0, len(steps), 10)]),
        "eval_reward_curve": _eval_curve(evals, "eval_reward"),
        "eval_reward_parts": {part: _eval_curve(evals, f"eval_teacher_reward/{part}") for part in RLT_PARTS},
        "checkpoints": sorted(int(path.name.rsplit("-", 1)[1]) for path in folder.glob("checkpoint-*")
                              if path.name.rsplit("-", 1)[1].isdigit())}


def sft_teacher_summary(folder: Path) -> dict:
    """The SFT teacher's ``sft_summary.json`` in a few numbers: ``steps``, ``rows``, the held-out loss first
    (before training) and best (the lowest measured, at ``best_step``), and its early stopping."""
    summary = json.loads((folder / SFT_SUMMARY_FILE).read_text())
    curve = [point for point in summary.get("heldout_curve") or [] if is_number(point.get("eval_loss"))]
    first = summary.get("heldout_loss_before")
    if first is None and curve:
        first = curve[0]["eval_loss"]
    best = min(curve, key=lambda point: point["eval_loss"]) if curve else None
    return {"steps": summary.get("steps"), "rows": summary.get("rows"),
            "heldout_loss_first": None if first is None else round(float(first), 4),
            "heldout_loss_best": None if best is None else round(float(best["eval_loss"]), 4),
            "best_step": None if best is None else best["step"], "early_stopping": summary.get("early_stopping")}


def distill_summary(folder: Path, phases: str | None) -> dict:
    """A distill's folder (``distill.jsonl``, ``config.yaml``) and the phases of its end line (``phases``, as
    logged: ``phase/generate/seconds 4.7, ...``; those of its last run when it was resumed; None when it never
    ended): its ``teacher`` (from below the last ``teachers/`` of its path, the same wherever the study ran:
    ``below_teachers``), ``reward_setting``, ``rows``, the mean kept
    ``total`` reward and its parts, whether it is ``complete`` (it logged its end line; else its rows are the
    questions it explained before it stopped) and its phases' ``seconds`` (none when not complete)."""
    cfg = OmegaConf.load(folder / CONFIG_FILE)
    rows = _jsonl(folder / DISTILL_FILE)
    seconds = dict(part.rsplit(" ", 1) for part in (phases or "").split(", ") if part)
    return {"teacher": below_teachers(str(cfg.model.model_name_or_path)),
            "reward_setting": OmegaConf.select(cfg, "data.gsm_solution"), "rows": len(rows),
            **{f"mean_{part}": _mean([row[part] for row in rows if is_number(row.get(part))])
               for part in ("total", "r_ss", "r_kl")},
            "complete": phases is not None,
            "seconds": {match["phase"]: float(value) for key, value in seconds.items()
                        if (match := _PHASE_SECONDS.match(key))}}


def _distill_end(log: Path) -> str | None:
    """The phases of the last end line a distill's log holds; None when it never ended."""
    lines = log.read_text().splitlines() if log.is_file() else []
    ends = [match["phases"] for line in lines if (match := _DISTILL_DONE.search(line))]
    return ends[-1] if ends else None


def rl_teacher_saved(run: Path) -> bool:
    """Whether an RL run folder holds its trained teacher: its ``final/``, or (where ``final/`` was left out of an
    archive) its README.md's "steps done" line saying the trained teacher is in ``final/``."""
    readme = run / README_FILE
    return (run / "final").is_dir() or (readme.is_file() and _TEACHER_SAVED.search(readme.read_text()) is not None)


def read_teachers(root: Path) -> dict[str, dict[str, dict]]:
    """``{"teachers": {name: summary}, "distills": {name: summary}}`` of the runs under ``<root>/teachers``: an
    SFT teacher with its ``sft_summary.json``, an RL teacher that saved its trained teacher (``rl_teacher_saved``;
    one stopped by ``trainer.max_minutes`` counts), every distill with its ``distill.jsonl`` (one whose log in
    ``<root>/logs`` has no end line is kept with ``complete`` false, with a warning). A teacher not finished is
    left out with a warning."""
    folder = root / "teachers"
    if not folder.is_dir():
        raise StudyError(f"no teachers/ under {root}: pass the root the teachers part of bench/study_fair.sh wrote")
    found: dict[str, dict[str, dict]] = {"teachers": {}, "distills": {}}
    sft = folder / "sft"
    if (sft / SFT_SUMMARY_FILE).is_file():
        found["teachers"]["sft"] = sft_teacher_summary(sft)
    elif sft.is_dir():
        logger.warning("%s: no %s (not finished): left out", sft, SFT_SUMMARY_FILE)
    for run in sorted(folder.glob("*/rl")):
        if rl_teacher_saved(run):
            found["teachers"][run.parent.name] = rl_teacher_summary(run)
        else:
            logger.warning("%s: no final/ and its %s does not say the trained teacher is in final/ (not finished): "
                           "left out", run, README_FILE)
    for run in sorted(folder.glob("distill_*")):
        name, log = run.name.removeprefix("distill_"), root / "logs" / f"{run.name}.log"
        if not (run / DISTILL_FILE).is_file():
            logger.warning("%s: no %s (not started): left out", run, DISTILL_FILE)
            continue
        phases = _distill_end(log)
        found["distills"][name] = distill_summary(run, phases)
        if phases is None:
            logger.warning("%s: not finished (no end line in %s): kept as partial (%d rows)", run, log,
                           found["distills"][name]["rows"])
    for distill in found["distills"].values():  # a checkpoint that explained: its folder is not sent back
        match = _CHECKPOINT_TEACHER.match(distill["teacher"])
        if match and match["run"] in found["teachers"]:
            run = found["teachers"][match["run"]]
            run["checkpoints"] = sorted({*run["checkpoints"], int(match["step"])})
    if not found["teachers"] and not found["distills"]:
        raise StudyError(f"{folder}: no finished teacher or distill yet")
    return found


def distill_files(root: Path) -> dict[str, Path]:
    """``{name: rows file}`` of every distill under ``root``: ``teachers/distill_<name>/distill.jsonl``, else
    ``distilled/<name>.jsonl``."""
    names = {path.parent.name.removeprefix("distill_") for path in root.glob(f"teachers/distill_*/{DISTILL_FILE}")}
    names |= {path.stem for path in root.glob(f"{DISTILLED_FOLDER}/*.jsonl")}
    files = {}
    for name in sorted(names):
        own = root / "teachers" / f"distill_{name}" / DISTILL_FILE
        files[name] = own if own.is_file() else root / DISTILLED_FOLDER / f"{name}.jsonl"
    return files


def _common_rows(root: Path) -> tuple[dict[str, list[tuple[str, dict]]], set[str]]:
    """Each distill's ``(line, row)`` pairs (``distill_files``) and the questions every one of them explained."""
    files = distill_files(root)
    if not files:
        raise StudyError(f"no distill under {root} (teachers/distill_<name>/{DISTILL_FILE} or "
                         f"{DISTILLED_FOLDER}/<name>.jsonl): pass the root the teachers part of bench/study_fair.sh "
                         "wrote")
    rows = {name: _jsonl_lines(path) for name, path in files.items()}
    return rows, _questions_in_all(rows)


def _questions_in_all(rows: dict[str, list[tuple[str, dict]]]) -> set[str]:
    """The questions every file of ``rows`` (``{name: [(line, row), ...]}``) holds."""
    return set.intersection(*({row["question"] for _, row in pairs} for pairs in rows.values()))


def _share(values: list[bool]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None


def common_block(root: Path) -> dict | None:
    """The questions every distill under ``root`` explained (``distill_files``), their distinct ``templates`` and
    per distill, over its kept explanations of them: the mean ``total`` reward and its parts, the share
    ``matched``, the share with ``wrong_equations`` above 0 and the mean explanation length in characters. None
    when no question is common to them all."""
    rows, common = _common_rows(root)
    return rows_common_block(rows, common)


def rows_common_block(rows: dict[str, list[tuple[str, dict]]], common: set[str]) -> dict | None:
    """``common_block`` of ``rows`` (``{name: [(line, row), ...]}``) over the questions ``common``."""
    if not common:
        return None
    kept = {name: [row for _, row in pairs if row["question"] in common] for name, pairs in rows.items()}
    templates = {json.dumps(row.get("template")) for pairs in kept.values() for row in pairs}
    return {"questions": len(common), "templates": len(templates), "distills": {name: {
        **{f"mean_{part}": _mean([row[part] for row in mine if is_number(row.get(part))])
           for part in ("total", "r_ss", "r_kl")},
        "matched_frac": _share([bool(row["matched"]) for row in mine if isinstance(row.get("matched"), bool)]),
        "wrong_equations_frac": _share([row["wrong_equations"] > 0 for row in mine
                                        if is_number(row.get("wrong_equations"))]),
        "mean_explanation_chars": _mean([len(row["explanation"]) for row in mine
                                         if isinstance(row.get("explanation"), str)])}
        for name, mine in kept.items()}}


def students_rows(root: Path) -> dict[str, list[str]]:
    """Each distill's rows of the questions every distill under ``root`` explained, as the students read them: one
    JSON line per question, ``question_id`` first, then the row as the distill wrote it, sorted by question id (the
    same order in every file, whatever order the distills wrote). An empty common set is refused."""
    rows, common = _common_rows(root)
    if not common:
        raise StudyError(f"{root}: no question every distill explained ({', '.join(rows)}): nothing written")
    lines = {}
    for name, pairs in rows.items():
        kept = sorted((_question_id(row["question"]), row) for _, row in pairs if row["question"] in common)
        lines[name] = [json.dumps({"question_id": question_id, **row}) for question_id, row in kept]
    return lines


def _text(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_students_file(out: Path, name: str, data: bytes, replace: bool) -> Path:
    """``out/<name>.jsonl.gz`` of the uncompressed rows ``data``: the same bytes for the same rows (no time stamp).
    A file already there with other rows is replaced only with ``replace``."""
    path = out / f"{name}{STUDENTS_SUFFIX}"
    if not replace and path.is_file() and gzip.decompress(path.read_bytes()) != data:
        raise StudyError(f"{path}: holds other rows than the kept ones: restore into an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    write_bytes(path, gzip.compress(data, mtime=0))
    return path


def write_common(root: Path, out: Path) -> list[tuple[Path, int]]:
    """``out/<name>.jsonl.gz`` of ``students_rows`` for every distill under ``root``; returns ``(file, rows)`` of
    each. A file there is replaced (a later ``wait`` brings more rows)."""
    return [(_write_students_file(out, name, _text(lines), replace=True), len(lines))
            for name, lines in students_rows(root).items()]


def _root_file(root: Path, name: str) -> str | None:
    """The text of ``root/<name>`` (the commit or command a study was started with), or None."""
    path = root / name
    text = path.read_text().strip() if path.is_file() else ""
    return text or None


def _config(path: Path) -> dict | None:
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else None


def below_teachers(teacher: str) -> str:
    """A teacher's path as the host named it (``<study>/teachers/rl_s0/rl/final``) from below its last
    ``teachers/`` (``rl_s0/rl/final``), the same on every host; a path without one as it is."""
    parts = Path(teacher).parts
    if "teachers" not in parts:
        return teacher
    return "/".join(parts[len(parts) - parts[::-1].index("teachers"):])


def _provenance(root: Path, name: str, rows: list[str]) -> dict:
    """What ``root`` records of how distill ``name``'s rows were made: its ``teacher`` (as the distill's config, else
    its rows, name it; the part below ``teachers/`` where there is one), the study's ``commit`` and ``command``
    (``root/commit``, ``root/command``) and the ``config`` of the teacher's training run and of the distill (their
    ``config.yaml``); None where not there."""
    distill = _config(root / "teachers" / f"distill_{name}" / CONFIG_FILE)
    recorded = {json.loads(line).get("teacher") for line in rows} - {None}
    teacher = (distill or {}).get("model", {}).get("model_name_or_path") or (
        recorded.pop() if len(recorded) == 1 else None)
    training = None
    if teacher is not None and (below := below_teachers(teacher)) != teacher:
        teacher = below
        training = _config((root / "teachers" / below).parent / CONFIG_FILE)  # its run's, beside final/
    return {"teacher": teacher, "commit": _root_file(root, "commit"), "command": _root_file(root, "command"),
            "config": {"training": training, "distill": distill}}


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST_FILE
    return json.loads(path.read_text()) if path.is_file() else {"teachers": {}}


def kept_solutions(folder: Path) -> dict[str, str]:
    """The text each kept distill's ``r_ss`` scored: its run's ``data.gsm_solution`` (``worked``, or ``answer`` for
    the answer-only teacher's distill); ``worked``, that setting's default, where the manifest records no config."""
    teachers = _read_manifest(folder)["teachers"]
    return {name: ((entry.get("config") or {}).get("distill") or {}).get("data", {}).get("gsm_solution") or "worked"
            for name, entry in teachers.items()}


def keep(root: Path, out: Path, replace: bool = False) -> list[tuple[Path, int, str]]:
    """Keep in ``out`` the explanations the students read (``students_rows``), for the repository: per distill
    ``<name>.jsonl.xz`` of its rows and its entry in ``manifest.json`` (``file``, ``rows``, the ``sha256`` of the
    uncompressed rows and ``_provenance``). A distill kept already with other rows is refused, before anything is
    written, unless ``replace`` (and even then where the new rows cover only some of the kept questions: a partial
    distill in the root narrowed them); one kept with the same rows keeps its file and entry. Returns ``(file, rows,
    "kept" | "already kept" | "replaced")`` of each."""
    lines = students_rows(root)
    plans = []
    for name, mine in lines.items():
        data, path = _text(mine), out / f"{name}{KEPT_SUFFIX}"
        held_rows = lzma.decompress(path.read_bytes()) if path.is_file() else None
        held, digest = None if held_rows is None else _sha256(held_rows), _sha256(data)
        if held not in (None, digest) and not replace:
            raise StudyError(f"{path}: {name} is kept already with other rows (sha256 {held[:12]}, these "
                             f"{digest[:12]}): keep these into another folder, or pass --replace")
        if held not in (None, digest):
            kept_ids = {json.loads(line)["question_id"] for line in held_rows.decode().splitlines() if line.strip()}
            new_ids = {json.loads(line)["question_id"] for line in mine}
            if new_ids < kept_ids:  # fewer questions, all of them kept already: a partial distill narrowed the set
                raise StudyError(f"{path}: --replace would keep {name} on {len(new_ids)} of its {len(kept_ids)} "
                                 f"kept questions: a distill in {root} that explained fewer questions (a partial "
                                 "one) narrows the questions every distill explained; move it out of the root, or "
                                 "keep into another folder")
        state = "kept" if held is None else "already kept" if held == digest else "replaced"
        plans.append((name, data, path, digest, state))
    manifest = _read_manifest(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data, path, digest, state in plans:
        if state == "already kept" and name in manifest["teachers"]:
            continue
        if state != "already kept":
            write_bytes(path, lzma.compress(data))
        manifest["teachers"][name] = {"file": path.name, "rows": len(lines[name]), "sha256": digest,
                                      **_provenance(root, name, lines[name])}
    manifest["teachers"] = dict(sorted(manifest["teachers"].items()))
    write_json(out / MANIFEST_FILE, manifest)
    return [(path, len(lines[name]), state) for name, _, path, _, state in plans]


def read_kept(folder: Path) -> dict[str, list[tuple[str, dict]]]:
    """Each distill ``keep`` kept in ``folder``: ``{name: [(line, row), ...]}``, its file checked against its sha256
    in ``manifest.json``."""
    teachers = _read_manifest(folder)["teachers"]
    if not teachers:
        raise StudyError(f"{folder}: no {MANIFEST_FILE} naming kept explanations (bench/study_fair.py keep <root> "
                         f"--out {folder} writes them)")
    rows = {}
    for name, entry in teachers.items():
        path = folder / entry["file"]
        if not path.is_file():
            raise StudyError(f"{path}: not there, but {MANIFEST_FILE} names it for {name}")
        data = lzma.decompress(path.read_bytes())
        if _sha256(data) != entry["sha256"]:
            raise StudyError(f"{path}: its rows are not the ones kept (sha256 {_sha256(data)[:12]}, "
                             f"{MANIFEST_FILE}: {entry['sha256'][:12]})")
        rows[name] = [(line, json.loads(line)) for line in data.decode().splitlines()]
    return rows


def restore(folder: Path, out: Path) -> list[tuple[Path, int]]:
    """The students' files (``out/<name>.jsonl.gz``, as ``common`` writes them) from the explanations ``keep`` kept
    in ``folder``: each kept file checked against its sha256 in ``manifest.json``, then its rows of the questions
    every kept distill explained (all of them, when they were kept together), byte for byte. Returns ``(file,
    rows)`` of each."""
    rows = read_kept(folder)
    common = _questions_in_all(rows)
    written = []
    for name, pairs in rows.items():
        lines = [line for line, row in pairs if row["question"] in common]
        written.append((_write_students_file(out, name, _text(lines), replace=False), len(lines)))
    return written


def check_students_inputs(folder: Path, distilled: Path) -> list[str]:
    """What a students part would read wrongly in ``distilled`` against the explanations kept in ``folder``: a kept
    SFT sample of a seed (``sft_s<seed>``) or the answer-only teacher's rows missing there (bench/study_fair.sh
    would then teach those students from ``sft``, or not at all), or an SFT sample there that is not kept (its
    students would read rows the summary refuses). ``check_distilled`` checks the rows of the files there are."""
    kept = set(_read_manifest(folder)["teachers"])
    there = {path.stem for path in distilled.glob("*.jsonl")}
    wrong = [f"{distilled}: no {name}.jsonl, which {folder} keeps (its students would read other rows): restore "
             f"it with bench/study_fair.py restore {folder} --out <an empty folder>"
             for name in sorted(kept - there) if _SFT_SAMPLE.match(name) or name == ANSWER_ONLY_TEACHER]
    wrong += [f"{distilled / name}.jsonl: an SFT teacher's sample that {folder} does not keep (its students' rows "
              f"could not be checked): keep it (bench/study_fair.py keep) or remove it"
              for name in sorted(there - kept) if _SFT_SAMPLE.match(name)]
    return wrong


def check_distilled(folder: Path, distilled: Path, own: Path | None = None) -> list[str]:
    """What is wrong with the students' and teachers' input files in ``distilled`` (``<name>.jsonl``) against the
    explanations ``keep`` kept in ``folder``: a file named as a kept teacher must hold its kept rows (the whole kept
    file, or the rows ``restore`` writes of it: ``_kept_digests``), or a part would train on other rows (a raw
    distill unpacked there, an earlier part's teacher) or skip a distill it was meant to run. Given ``own`` (a
    teachers part's ``<root>/teachers``), a file that is that root's own distill (``own/distill_<name>/distill.jsonl``
    byte for byte, as the part copies it) is its own output, and passes: the part run again on its root. Files of
    teachers not kept are not checked. One line per file, empty when all is well."""
    digests = _kept_digests(folder)
    wrong = []
    for name in sorted(digests):
        path = distilled / f"{name}.jsonl"
        if not path.is_file():
            continue
        data = _sha256(path.read_bytes())
        written = own / f"distill_{name}" / DISTILL_FILE if own is not None else None
        if written is not None and written.is_file() and _sha256(written.read_bytes()) == data:
            continue
        if data not in digests[name]:
            wrong.append(f"{path} holds other rows than the kept {name} ({folder}): remove it, or write it again with "
                         f"bench/study_fair.py restore {folder} --out <an empty folder>")
    return wrong


# The weights' dtypes in which a step of the RL learning rate mostly rounds away
ROUNDING_DTYPES = module_constant("rlt_mono.runs.precision", "LOW_PRECISION_NAMES")


def rounded_teachers(folder: Path) -> list[str]:
    """The kept teachers of ``folder`` whose training run trained its full weights in bfloat16 or float16 (its
    config's ``model.dtype`` in the manifest, with no LoRA adapter nor 4-bit base, whose adapters train in
    float32): most of each optimizer step rounded away (docs/STUDY.md, "Steps that round away"), so their
    explanations are not the method's. A teacher whose config was not sent back is not named."""
    names = []
    for name, entry in sorted(_read_manifest(folder)["teachers"].items()):
        model = ((entry.get("config") or {}).get("training") or {}).get("model") or {}
        if (model.get("dtype") in ROUNDING_DTYPES and not model.get("lora_r")
                and not model.get("load_in_4bit")):
            names.append(name)
    return names


def _figures(entry: dict, where: dict) -> str:
    return json.dumps({key: value for key, value in entry.items() if key not in where}, sort_keys=True)


def write_teachers(root: Path, out: Path, where: dict) -> tuple[list[str], list[str], dict | None]:
    """``out``: the teachers file with the finished teachers and distills of ``root`` (each with ``where``) added
    to what it held, and, where ``root`` has distills, its ``common`` block (``common_block``) in place of the one
    the file held (none when no question is common to them all); returns ``(added, already there, common)``, as
    ``teacher <name>`` / ``distill <name>``. A teacher or distill already in the file with other figures is
    refused: one is added once."""
    found = read_teachers(root)
    common = common_block(root) if distill_files(root) else None
    try:
        merged = json.loads(out.read_text()) if out.is_file() else {"teachers": {}, "distills": {}}
    except json.JSONDecodeError as err:
        raise StudyError(f"{out}: not a teachers file ({err.msg}); pass another --out") from err
    added, kept = [], []
    for kind, entries in found.items():
        held = merged.setdefault(kind, {})
        for name, entry in entries.items():
            entry = json.loads(json.dumps({**entry, **where}))
            label = f"{kind[:-1]} {name}"
            if name not in held:
                held[name] = entry
                added.append(label)
            elif _figures(held[name], where) == _figures(entry, where):
                kept.append(label)
            else:
                raise StudyError(f"{out} has {label} already, from commit {held[name].get('commit', '?')} on "
                                 f"{held[name].get('device', '?')}, with other figures: one is added once (delete "
                                 "its entry to replace it)")
        merged[kind] = dict(sorted(held.items()))
    if distill_files(root):
        merged.pop("common", None)
        if common is None:
            logger.warning("%s: no question every distill explained: no common block", root)
        else:
            merged["common"] = common
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, merged, indent=1)
    return added, kept, common


def _matrix(per_seed: dict[int, list[dict]], held_out: str) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """Correctness (seeds x questions, questions in one sorted order), the questions, each one's template, and
    whether each answer was cut at the cap (seeds x questions)."""
    by_seed = {seed: {row["question"]: row for row in rows if row.get("heldout") == held_out
                      and row.get("correct") is not None} for seed, rows in per_seed.items()}
    questions = sorted(set.intersection(*(set(rows) for rows in by_seed.values())))
    first = next(iter(by_seed.values()))
    templates = np.array([first[q].get("template", -1) for q in questions])
    correct = np.array([[float(by_seed[s][q]["correct"]) for q in questions] for s in sorted(by_seed)])
    capped = np.array([[bool(by_seed[s][q].get("capped")) for q in questions] for s in sorted(by_seed)])
    return correct, questions, templates, capped


def _question_weights(templates: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples x questions) counts: templates drawn with replacement, then questions within each drawn one."""
    groups = [np.flatnonzero(templates == t) for t in np.unique(templates)]
    weights = np.zeros((resamples, len(templates)))
    for b in range(resamples):
        for g in rng.integers(len(groups), size=len(groups)):
            members = groups[g]
            np.add.at(weights[b], members[rng.integers(len(members), size=len(members))], 1.0)
    return weights


def _seed_means(correct: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples x questions): each question's mean over a resample of the seeds."""
    picks = rng.integers(len(correct), size=(resamples, len(correct)))
    return correct[picks].mean(axis=1)


def seed_t_interval(a: list[float], b: list[float]) -> dict | None:
    """Two arms' difference in mean accuracy with a Welch t interval over their per-seed accuracies alone: each
    seed's accuracy on the same questions one observation, the questions held fixed. Beside the bootstrap, which
    resamples three seeds with replacement (ten distinct draws) and so may understate the spread between seeds. An
    arm of one seed counts as exact (an untrained student's greedy answers have no seed); None where neither arm has
    two seeds. The degrees of freedom are Welch-Satterthwaite's, rounded down for the quantile (wider, not
    narrower)."""
    terms = [(float(np.var(x, ddof=1)) / len(x), len(x) - 1) for x in (a, b) if len(x) >= 2]
    if not terms:
        return None
    point = float(np.mean(a) - np.mean(b))
    variance = sum(v for v, _ in terms)
    df = variance ** 2 / sum(v ** 2 / d for v, d in terms) if variance > 0 else float(sum(d for _, d in terms))
    half = T_975[min(max(int(df), 1), len(T_975)) - 1] * variance ** 0.5
    return {"difference": round(point, 4), "ci95": [round(point - half, 4), round(point + half, 4)],
            "df": round(df, 2), "seeds": [len(a), len(b)]}


def _interval(samples: np.ndarray) -> list[float]:
    return [round(float(np.percentile(samples, 2.5)), 4), round(float(np.percentile(samples, 97.5)), 4)]


def summarize(arms: dict, resamples: int, seed: int, teachers: dict | None = None) -> dict:
    """Per student: every arm's accuracy per held-out set (arms in ``arm_rank`` order), the differences of
    ``DIFFERENCES``, the positive control and the ``correlation`` with the teachers of ``teachers`` (the teachers
    file)."""
    rng = np.random.default_rng(seed)
    students = {}
    for student, per_arm in sorted(arms.items()):
        entry = {"arms": {}, "differences": {}}
        answers = {}  # per held-out set: the resamples' question weights and each arm's answers (the correlation's)
        for held_out, name in SETS.items():
            matrices = {arm: _matrix(per_seed, held_out) for arm, per_seed in per_arm.items()}
            matrices = {arm: m for arm, m in matrices.items() if m[1]}
            if not matrices:
                continue
            shared = sorted(set.intersection(*(set(m[1]) for m in matrices.values())))
            keep = {arm: np.isin(m[1], shared) for arm, m in matrices.items()}
            templates = next(iter(matrices.values()))[2][keep[next(iter(matrices))]]
            weights = _question_weights(templates, resamples, rng)
            answers[name] = {"weights": weights, "correct": {arm: m[0][:, keep[arm]] for arm, m in matrices.items()}}
            boot, seed_means, cut = {}, {}, {}
            for arm, (correct, _, _, capped_matrix) in matrices.items():
                correct = correct[:, keep[arm]]
                cut[arm] = capped_matrix[:, keep[arm]].any(axis=0)  # a question some seed's answer was cut on
                seed_means[arm] = _seed_means(correct, resamples, rng)
                boot[arm] = (weights * seed_means[arm]).sum(1) / weights.sum(1)
                capped = [row.get("capped") for rows in per_arm[arm].values() for row in rows
                          if row.get("heldout") == held_out]
                entry["arms"].setdefault(arm, {"seeds": sorted(per_arm[arm])})[name] = {
                    "accuracy": round(float(correct.mean()), 4), "ci95": _interval(boot[arm]),
                    "questions": int(correct.shape[1]), "templates": int(len(np.unique(templates))),
                    "per_seed": [round(float(x), 4) for x in correct.mean(axis=1)],
                    "capped_frac": round(float(np.mean([bool(c) for c in capped])), 4) if capped else None,
                    "looped_frac": _looped_frac(per_arm[arm], held_out)}
            for arm, minus in DIFFERENCES:
                if arm in boot and minus in boot:
                    point = entry["arms"][arm][name]["accuracy"] - entry["arms"][minus][name]["accuracy"]
                    figures = {"difference": round(point, 4), "ci95": _interval(boot[arm] - boot[minus])}
                    seeds_alone = seed_t_interval(entry["arms"][arm][name]["per_seed"],
                                                  entry["arms"][minus][name]["per_seed"])
                    if seeds_alone is not None:
                        figures["seed_t"] = seeds_alone
                    over = {a: entry["arms"][a][name]["capped_frac"] for a in (arm, minus)
                            if (entry["arms"][a][name]["capped_frac"] or 0) > CAP_BAR}
                    if over:  # the difference is also given where neither arm cut (CAP_BAR)
                        figures["cut_above_bar"] = over
                        figures["uncut"] = _uncut_difference(
                            [matrices[a][0][:, keep[a]] for a in (arm, minus)], [seed_means[a] for a in (arm, minus)],
                            ~(cut[arm] | cut[minus]), weights)
                    entry["differences"].setdefault(f"{arm} - {minus}", {})[name] = figures
        entry["arms"] = {arm: entry["arms"][arm] for arm in sorted(entry["arms"], key=arm_rank)}
        entry["positive_control"] = positive_control(entry)
        entry["correlation"] = correlation(entry["arms"], teachers, resamples, seed, answers)
        students[student] = entry
    return students


# What the finished study must hold (docs/STUDY.md, "Why a second study"): both students; per student every arm,
# three seeds of each trained one, a passing positive control, held-out sets of at least 1,000 questions (the
# held-out templates at least 15 of them) and at least four RL teachers in the correlation; every run at one commit.
REQUIRED_STUDENTS = ("qwen2.5_coder_0.5b_instruct", "qwen2.5_coder_1.5b_instruct")
REQUIRED_ARMS = ("untrained", "untrained_plain", "worked", "traces", "sft_teacher", "rl_teacher",
                 "rl_teacher_answer_only")
MIN_SEEDS, MIN_QUESTIONS, MIN_TEMPLATES, MIN_RL_TEACHERS = 3, 1000, 15, 4


def requirements(students: dict, commits: list[str], rows_checked: bool = True, traces_checked: bool = True) -> dict:
    """Each rule of the finished study (``REQUIRED_*``, ``MIN_*``): ``met``, and ``short`` naming what falls short
    of it (empty where met), so that an interim summary says plainly how far the study is from done.
    ``rows_checked``: the taught runs' rows were checked against the kept explanations (``--explanations``), the one
    check that an SFT-teacher student of seed s read the SFT teacher's sample s, and every taught student its own
    teacher's kept rows; ``traces_checked``: the traces runs' rows against the committed traces (``--traces``)."""
    taught = sorted(f"{student}/{arm}" for student, entry in students.items() for arm in entry["arms"]
                    if (_kept_teacher(arm, 0) is not None and not rows_checked)
                    or (arm == "traces" and not traces_checked))
    short = {"students": [s for s in REQUIRED_STUDENTS if s not in students],
             "arms": [], "seeds": [], "positive_control": [], "held_out_sets": [], "correlation": [],
             "one_commit": [] if len(commits) == 1 else [f"{len(commits)} commits: {', '.join(commits)}"],
             "rows_checked": [] if not taught else
             [f"the rows of {', '.join(taught)} were not checked against the kept ones (--explanations, --traces)"]}
    for student, entry in students.items():
        arms = entry["arms"]
        short["arms"] += [f"{student}/{arm}" for arm in REQUIRED_ARMS if arm not in arms]
        short["seeds"] += [f"{student}/{arm}: {len(figures['seeds'])}" for arm, figures in arms.items()
                           if arm not in UNTRAINED_ARMS and len(figures["seeds"]) < MIN_SEEDS]
        control = entry.get("positive_control")
        if not control or not control["passes"]:
            short["positive_control"].append(f"{student}: {'fails' if control else 'not run'}")
        for arm, figures in arms.items():
            for name in SETS.values():
                f = figures.get(name)
                if f is None or f["questions"] < MIN_QUESTIONS \
                        or (name == SETS["templates"] and f["templates"] < MIN_TEMPLATES):
                    short["held_out_sets"].append(
                        f"{student}/{arm} {name}: " + ("none" if f is None else
                                                       f"{f['questions']} questions, {f['templates']} templates"))
        rl_teachers = entry.get("correlation", {}).get("rl_teachers", 0)
        if rl_teachers < MIN_RL_TEACHERS:
            short["correlation"].append(f"{student}: {rl_teachers} RL teachers")
    return {rule: {"met": not falls, "short": falls} for rule, falls in short.items()}


def requirements_line(rules: dict) -> str:
    """study_table.md's last line: the rules the study meets and, for each it does not, what falls short."""
    unmet = [f"{rule} ({'; '.join(r['short'][:4])}{'; ...' if len(r['short']) > 4 else ''})"
             for rule, r in rules.items() if not r["met"]]
    met = [rule for rule, r in rules.items() if r["met"]]
    return (f"\nThe finished study's requirements: met: {', '.join(met) or 'none'}; not met: "
            f"{', '.join(unmet) or 'none'}.\n")


def _looped_frac(per_seed: dict[int, list[dict]], held_out: str) -> float | None:
    """The share of an arm's answers on ``held_out`` that loop (``looped``); None where a run's export kept no loop
    bit."""
    loops = [row.get("looped") for rows in per_seed.values() for row in rows if row.get("heldout") == held_out]
    if not loops or any(loop is None for loop in loops):
        return None
    return round(float(np.mean(loops)), 4)


def _uncut_difference(correct: list[np.ndarray], seed_means: list[np.ndarray], uncut: np.ndarray,
                      weights: np.ndarray) -> dict:
    """Two arms' difference on the questions no seed of either cut at the cap, with the same resamples of templates,
    questions and seeds as the full difference, restricted to those questions."""
    if not uncut.any():
        return {"questions": 0}
    w = weights[:, uncut]
    total = np.maximum(w.sum(1), 1e-12)  # a resample that drew none of these questions adds a zero
    boot = [(w * means[:, uncut]).sum(1) / total for means in seed_means]
    point = float(correct[0][:, uncut].mean() - correct[1][:, uncut].mean())
    return {"questions": int(uncut.sum()), "difference": round(point, 4), "ci95": _interval(boot[0] - boot[1])}


def positive_control(entry: dict) -> dict | None:
    """The worked-solution students against the better untrained prompt, on held-out instances."""
    name = SETS["instances"]
    untrained = [arm for arm in UNTRAINED_ARMS if name in entry["arms"].get(arm, {})]
    if CONTROL_ARM not in entry["arms"] or not untrained:
        return None
    baseline = max(untrained, key=lambda arm: entry["arms"][arm][name]["accuracy"])
    difference = entry["differences"][f"{CONTROL_ARM} - {baseline}"][name]
    passes = difference["difference"] >= CONTROL_MARGIN and difference["ci95"][0] > 0
    return {"arm": CONTROL_ARM, "baseline": baseline, "set": name, **difference, "passes": bool(passes),
            "rule": f"difference >= {CONTROL_MARGIN} and the interval above 0"}


def arm_rank(arm: str) -> tuple:
    """An arm's place in the study table: ``ARM_ORDER``, then rl_teacher_step<N> by N, then the rest by name."""
    if arm in ARM_ORDER:
        return (ARM_ORDER.index(arm), 0, "")
    if match := _STEP_ARM.match(arm):
        return (len(ARM_ORDER), int(match["step"]), "")
    return (len(ARM_ORDER) + 1, 0, arm)


def _reward_at(curve: list[list[float]], step: int) -> list[float]:
    """``[step, eval_reward]`` of the evaluation at ``step``, else of the one nearest it (the earlier on a tie)."""
    return min(curve, key=lambda point: (abs(point[0] - step), point[0]))


def _arm_distill(arm: str, seed: int, distills: frozenset[str] | set[str] = frozenset()) -> tuple[str, str] | None:
    """``(teacher, distill)`` of a taught arm's students of ``seed``: sft_teacher -> sft, distill sft_s<seed> where
    ``distills`` (the distills there are) has it (the SFT teacher's sample with that seed: bench/study_fair.sh's
    STUDY_SFT_SEEDS), else sft; rl_teacher -> rl_s<seed>; rl_teacher_step<N> -> rl_s0's checkpoint N, distill
    rl_step<N>; None for an arm no teacher taught."""
    if arm == "sft_teacher":
        sample = SFT_SAMPLE.format(seed=seed)
        return "sft", sample if seed != 0 and sample in distills else "sft"
    if arm == "rl_teacher":
        return f"rl_s{seed}", f"rl_s{seed}"
    if match := _STEP_ARM.match(arm):
        return "rl_s0", f"rl_step{match['step']}"
    return None


def correlation_x(teachers: dict | None) -> str:
    """What a correlation's teacher reward is: the common block's mean explanation reward when the teachers file
    has one, else the held-out reward."""
    if teachers is not None and teachers.get("common"):
        source = (f"the kept explanations in {teachers['common']['from']}" if teachers["common"].get("from")
                  else "the teachers file's common block")
        return (f"the mean RLT reward of the teacher's kept explanations of the {teachers['common']['questions']} "
                f"questions every teacher explained ({source})")
    return HELD_OUT_X


def correlation_points(arms: dict, teachers: dict) -> tuple[list[dict], list[str]]:
    """Each taught arm's students against the reward of the teacher that taught them, as points
    ``{arm, teacher, teacher_reward, reward_step | reward_from, seeds, <held-out set>: accuracy}``.

    When the teachers file has a ``common`` block, a teacher's reward is the block's ``mean_total`` of its distill
    (``_arm_distill``; the point says which as ``distill``): the mean RLT reward of its kept explanations of the
    questions every teacher explained; ``sft_teacher`` and ``rl_teacher_step<N>`` against the arm's accuracy over
    its seeds, ``rl_teacher`` seed s against seed s's students. Without one, the held-out reward:

    - ``sft_teacher``: the SFT teacher, whose held-out reward is the step-0 evaluation of the worked-reward RL runs
      that start from it (their mean), against the arm's accuracy over its seeds;
    - ``rl_teacher``: for each seed s, ``rl_s<s>``'s last held-out reward against seed s's students;
    - ``rl_teacher_step<N>``: ``rl_s0``'s held-out reward at step N (or the evaluation nearest N: ``reward_step``
      says which) against the arm's accuracy over its seeds.

    Also returns what is missing for a point, one sentence each. ``CORRELATION_LEFT_OUT`` arms give no point."""
    rl = {name: teacher for name, teacher in teachers.get("teachers", {}).items() if teacher.get("eval_reward_curve")}
    points, missing = [], []
    common = teachers.get("common")

    def point(arm: str, seeds: list[int], teacher: str, reward: float, where: dict) -> None:
        figures = arms[arm]
        accuracy = {name: float(np.mean([figures[name]["per_seed"][figures["seeds"].index(s)] for s in seeds]))
                    for name in SETS.values() if name in figures}
        points.append({"arm": arm, "teacher": teacher, "teacher_reward": round(reward, 4), **where, "seeds": seeds,
                       **{name: round(value, 4) for name, value in accuracy.items()}})

    for arm in sorted(arms, key=arm_rank):
        seeds = arms[arm]["seeds"]
        if common and _arm_distill(arm, 0) is not None:
            distills = set(common["distills"])
            # a point per seed where each seed's students read their own distill (the RL teachers; the SFT
            # teacher's seeded samples)
            own = len({_arm_distill(arm, seed, distills) for seed in seeds}) > 1 or arm == "rl_teacher"
            groups = [[seed] for seed in seeds] if own else [seeds]
            for group in groups:
                teacher, distill = _arm_distill(arm, group[0], distills)
                reward = common["distills"].get(distill, {}).get("mean_total")
                who = f"{arm} seed {group[0]}" if own else arm
                if reward is None:
                    missing.append(f"{who}: no mean reward of distill {distill} in the teachers file's common block")
                    continue
                point(arm, group, teacher, reward, {
                    "distill": distill, "reward_from": f"the mean RLT reward of its kept explanations of the "
                                                       f"{common['questions']} questions every teacher explained"})
        elif arm == "sft_teacher":
            starts = {name: teacher["eval_reward_curve"][0][1] for name, teacher in sorted(rl.items())
                      if teacher.get("reward_setting") == WORKED_REWARD and teacher["eval_reward_curve"][0][0] == 0}
            if starts:
                point(arm, seeds, "sft", float(np.mean(list(starts.values()))),
                      {"reward_from": f"step 0 of {', '.join(starts)} (mean)"})
            else:
                missing.append("sft_teacher: no worked-reward RL teacher has a held-out reward at step 0 "
                               "(trainer.eval_on_start)")
        elif arm == "rl_teacher":
            for seed in seeds:
                if f"rl_s{seed}" in rl:
                    step, reward = rl[f"rl_s{seed}"]["eval_reward_curve"][-1]
                    point(arm, [seed], f"rl_s{seed}", reward, {"reward_step": step})
                else:
                    missing.append(f"rl_teacher seed {seed}: no held-out reward of rl_s{seed} in the teachers file")
        elif match := _STEP_ARM.match(arm):
            if "rl_s0" in rl:
                step, reward = _reward_at(rl["rl_s0"]["eval_reward_curve"], int(match["step"]))
                point(arm, seeds, "rl_s0", reward, {"reward_step": step})
            else:
                missing.append(f"{arm}: no held-out reward of rl_s0 in the teachers file")
    return points, missing


def _ranks(values: np.ndarray) -> np.ndarray:
    """(n,): 1-based ranks of ``values`` (n,), tied values sharing their mean rank."""
    return np.array([(values < v).sum() + ((values == v).sum() + 1) / 2 for v in values])


def spearman(xs: np.ndarray, ys: np.ndarray) -> float | None:
    """Spearman's rho: Pearson's r of the ranks (None as ``pearson`` gives it)."""
    return pearson(_ranks(np.asarray(xs)), _ranks(np.asarray(ys)))


def correlation_figures(xs: list[float], ys: list[float], resamples: int, rng: np.random.Generator,
                        replicates: np.ndarray | None = None) -> dict:
    """Pearson's r and Spearman's rho of paired values, with ``points``; with at least
    ``CORRELATION_INTERVAL_POINTS`` a percentile-bootstrap ``ci95`` of each over the points (resamples where a side
    is constant have no r and are dropped: ``resamples_used``) and, given ``replicates`` (resamples x points: each
    point's ``ys`` value recomputed from a resample of the answers it stands on, ``_point_replicates``),
    ``ci95_answers``: the interval of r and rho over those, the points and ``xs`` fixed (how much the students'
    answers alone move the correlation); under ``CORRELATION_MIN_POINTS``, ``too few points``. A side that is
    constant has no r (null)."""
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)  # (n,), (n,)
    if len(x) < CORRELATION_MIN_POINTS:
        return {"points": len(x), "result": f"too few points (fewer than {CORRELATION_MIN_POINTS})"}
    figures: dict = {"points": len(x)}
    for name, statistic in (("pearson_r", pearson), ("spearman_rho", spearman)):
        value = statistic(x, y)
        figures[name] = None if value is None else round(value, 4)
    if len(x) < CORRELATION_INTERVAL_POINTS:
        figures["ci95"] = f"no interval under {CORRELATION_INTERVAL_POINTS} points"
        return figures
    draws = rng.integers(len(x), size=(resamples, len(x)))  # (resamples, n) point indices
    figures["ci95"] = {}
    for name, statistic in (("pearson_r", pearson), ("spearman_rho", spearman)):
        values = [v for draw in draws if (v := statistic(x[draw], y[draw])) is not None]
        figures["ci95"][name] = _interval(np.array(values)) if values else None
        figures["ci95"][f"{name}_resamples_used"] = len(values)
    if replicates is not None:
        figures["ci95_answers"] = {}
        for name, statistic in (("pearson_r", pearson), ("spearman_rho", spearman)):
            values = [v for row in replicates if (v := statistic(x, row)) is not None]
            figures["ci95_answers"][name] = _interval(np.array(values)) if values else None
            figures["ci95_answers"][f"{name}_resamples_used"] = len(values)
    return figures


def _point_replicates(points: list[dict], arms: dict, answers: dict, rng: np.random.Generator) -> np.ndarray:
    """(resamples x points): each point's accuracy recomputed as every interval of the study resamples (templates,
    then questions within them: ``answers["weights"]``, shared by all points; then the point's own seeds, where it
    has several: a one-seed point, such as each RL seed's, carries no seed spread), from its arm's answers
    (``answers["correct"][arm]``, seeds x questions in the arm's ``seeds`` order)."""
    weights = answers["weights"]
    columns = []
    for p in points:
        correct = answers["correct"][p["arm"]]
        rows = correct[[arms[p["arm"]]["seeds"].index(seed) for seed in p["seeds"]]]
        columns.append((weights * _seed_means(rows, len(weights), rng)).sum(1) / weights.sum(1))
    return np.stack(columns, axis=1)


def correlation(arms: dict, teachers: dict | None, resamples: int, seed: int, answers: dict | None = None) -> dict:
    """A student's teacher-reward <-> student-accuracy correlation: its ``points`` (``correlation_points``), how
    many distinct RL teachers they hold (``rl_teachers``: checkpoints and seeds; the SFT teacher is not one), per
    held-out set ``correlation_figures`` (with ``ci95_answers`` where ``answers``, summarize's per held-out set
    question weights and answers, has the set), what is ``missing`` and the arms ``left_out`` with why. Without a
    teachers file, no points."""
    points, missing = correlation_points(arms, teachers) if teachers is not None else ([], ["no teachers file"])
    rng = np.random.default_rng(seed)
    figures = {}
    for name in ("held_out_templates", "held_out_instances"):
        on_set = [p for p in points if name in p]
        replicates = (_point_replicates(on_set, arms, answers[name], rng)
                      if answers and name in answers and on_set else None)
        figures[name] = correlation_figures([p["teacher_reward"] for p in on_set], [p[name] for p in on_set],
                                            resamples, rng, replicates)
    rl_teachers = {(p["teacher"], p.get("distill"), p.get("reward_step")) for p in points if p["teacher"] != "sft"}
    return {"x": correlation_x(teachers), "y": "the taught students' accuracy", "points": points,
            "rl_teachers": len(rl_teachers), **figures, "missing": missing, "left_out": CORRELATION_LEFT_OUT}


def table(students: dict) -> str:
    """study_table.md: one row per student and arm."""
    lines = ["| student | arm | seeds | held-out templates | held-out instances | answers cut at the cap "
             "| answers that loop |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for student, entry in students.items():
        for arm, figures in entry["arms"].items():
            cells = []
            for name in ("held_out_templates", "held_out_instances"):
                f = figures.get(name)
                cells.append("—" if f is None else f"{f['accuracy']:.3f} [{f['ci95'][0]:.3f}, {f['ci95'][1]:.3f}] "
                                                   f"(n={f['questions']})")
            capped = [figures[n]["capped_frac"] for n in SETS.values() if figures.get(n, {}).get("capped_frac")
                      is not None]
            cut = f"{max(capped):.1%}" if capped else "—"
            loops = [figures[n]["looped_frac"] for n in SETS.values() if figures.get(n, {}).get("looped_frac")
                     is not None]
            loop = f"{max(loops):.1%}" if loops else "—"
            lines.append(f"| {student} | {arm} | {', '.join(map(str, figures['seeds']))} | {cells[0]} | {cells[1]} | "
                         f"{cut} | {loop} |")
        control = entry.get("positive_control")
        if not control and any(arm not in (CONTROL_ARM, *UNTRAINED_ARMS) for arm in entry["arms"]):
            lines.append("")
            lines.append(f"Positive control ({student}): not run (it needs the {CONTROL_ARM} students and an untrained "
                         f"one): no comparison of this student's arms rests on it.")
        if control:
            lines.append("")
            low, high = control["ci95"]
            lines.append(f"Positive control ({student}): {control['arm']} - {control['baseline']} on "
                         f"{control['set'].replace('_', ' ')}: {control['difference']:+.3f} [{low:+.3f}, {high:+.3f}]: "
                         f"{'passes' if control['passes'] else 'FAILS'} ({control['rule']}).")
        for pair, sets in entry["differences"].items():
            for name, d in sets.items():
                line = (f"- {student}, {pair}, {name.replace('_', ' ')}: {d['difference']:+.3f} "
                        f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]")
                if "seed_t" in d:
                    t = d["seed_t"]
                    line += (f" (the seeds alone, Welch t, df {t['df']:g}: [{t['ci95'][0]:+.3f}, "
                             f"{t['ci95'][1]:+.3f}])")
                if "cut_above_bar" in d:
                    over = ", ".join(f"{arm} {frac:.1%}" for arm, frac in d["cut_above_bar"].items())
                    uncut = d["uncut"]
                    line += f"; answers cut at the cap above {CAP_BAR:.0%}: {over}; on the {uncut['questions']} " \
                            "questions neither arm cut: " + ("none" if not uncut["questions"] else
                                                              f"{uncut['difference']:+.3f} [{uncut['ci95'][0]:+.3f}, "
                                                              f"{uncut['ci95'][1]:+.3f}]")
                lines.append(line)
        if "correlation" in entry:
            lines += ["", correlation_line(student, entry["correlation"])]
        lines.append("")
    return "\n".join(lines)


def plot(students: dict, path: Path) -> None:
    """study.png: per student, a panel per held-out set with each arm's accuracy and its 95% interval, arms in
    study order (top down); an arm whose answers were cut at the cap above ``CAP_BAR`` on that set is drawn hollow
    and says how many were cut."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = ("held_out_instances", "held_out_templates")
    rows = max(len(entry["arms"]) for entry in students.values())
    figure = Figure(figsize=(11, 0.45 * rows * len(students) + 1.2 * len(students)), layout="constrained")
    axes = figure.subplots(len(students), len(names), squeeze=False, sharex=True)
    for row, (student, entry) in enumerate(students.items()):
        arms = list(entry["arms"])
        for column, name in enumerate(names):
            ax = axes[row][column]
            for y, arm in enumerate(arms):
                figures = entry["arms"][arm].get(name)
                if figures is None:
                    continue
                accuracy, (low, high), cut = figures["accuracy"], figures["ci95"], figures["capped_frac"] or 0
                over = cut > CAP_BAR
                ax.barh(y, accuracy, color="white" if over else "tab:blue", edgecolor="tab:blue", hatch="//" if over
                        else None)
                ax.errorbar(accuracy, y, xerr=[[accuracy - low], [high - accuracy]], color="black", capsize=3)
                label = f"{accuracy:.3f}" + (f"  ({cut:.0%} cut)" if over else "")
                ax.text(high + 0.01, y, label, va="center", fontsize=8)
            ax.set_yticks(range(len(arms)), [f"{arm} (s{','.join(map(str, entry['arms'][arm]['seeds']))})"
                                             for arm in arms] if column == 0 else [""] * len(arms))
            ax.invert_yaxis()
            ax.set_xlim(0, 1.2)
            ax.set_xticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
            ax.set_title(f"{student}: {name.replace('_', ' ')}", fontsize=10)
            ax.grid(axis="x", alpha=0.3)
        for ax in axes[row]:
            ax.set_xlabel("accuracy (95% bootstrap: seeds, templates, questions)")
    FigureCanvasAgg(figure).print_png(str(path))


TEACHER_CURVES = (("reward", "held-out reward (r_SS - r_KL + match penalty)"),
                  ("r_ss", "r_SS: the student's log-prob of the solution"), ("r_kl", "r_KL: the penalty subtracted"))


def plot_teachers(teachers: dict, path: Path) -> list[str]:
    """teachers.png from merged teachers files (``read_teachers_files``): each RL teacher's held-out reward, r_SS
    and r_KL against its optimizer step, a panel each, a line per teacher (its step count and reward setting in the
    legend). Returns the teachers drawn; refuses a set with no held-out curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    drawn = {name: entry for name, entry in sorted(teachers["teachers"].items())
             if len(entry.get("eval_reward_curve") or []) >= 2}
    if not drawn:
        raise StudyError("no RL teacher with a held-out curve of two or more evaluations in these teachers files")
    figure = Figure(figsize=(15, 4.2), layout="constrained")
    axes = figure.subplots(1, len(TEACHER_CURVES))
    for ax, (key, title) in zip(axes, TEACHER_CURVES, strict=True):
        for name, entry in drawn.items():
            curve = entry["eval_reward_curve"] if key == "reward" else (entry.get("eval_reward_parts") or {}).get(key)
            if not curve:
                continue
            steps, values = zip(*curve, strict=True)
            label = f"{name} ({entry.get('steps', steps[-1])} steps, {entry.get('reward_setting', '?')} reward)"
            ax.plot(steps, values, marker="o", markersize=3, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    # 64 colours (line plots need no more): a quarter of the full-colour file's size, for results/'s budget
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba()).convert("RGB")
    data = io.BytesIO()
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(data, format="PNG", optimize=True)
    write_bytes(path, data.getvalue())
    return list(drawn)


def correlation_line(student: str, entry: dict) -> str:
    """The table's line for a student's correlation: r and rho per held-out set, or why there is none."""
    cells = []
    for name in ("held_out_templates", "held_out_instances"):
        figures, label = entry[name], name.replace("_", " ")
        if "result" in figures:
            cells.append(f"{label}: {figures['result']} (n={figures['points']})")
            continue
        interval = figures["ci95"] if isinstance(figures["ci95"], dict) else {}
        answers = figures.get("ci95_answers", {})
        values = []
        for key, symbol in (("pearson_r", "r"), ("spearman_rho", "rho")):
            value, ci, by_answers = figures[key], interval.get(key), answers.get(key)
            values.append(f"{symbol} " + ("undefined (a side is constant)" if value is None else f"{value:+.3f}")
                          + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}] over points" if ci else "")
                          + (f", [{by_answers[0]:+.3f}, {by_answers[1]:+.3f}] over answers" if by_answers else ""))
        cells.append(f"{label}: {', '.join(values)} (n={figures['points']})")
    teachers = ", ".join(f"{p['arm']}" + (f" s{p['seeds'][0]}" if p["arm"] == "rl_teacher"
                                          or _SFT_SAMPLE.match(p.get("distill", "")) else "")
                         for p in entry["points"])
    reward = "held-out reward" if entry["x"] == HELD_OUT_X else "reward on the common questions"
    return (f"Teacher {reward} vs student accuracy ({student}; points: {teachers or 'none'}; "
            f"{entry.get('rl_teachers', 0)} RL teachers): "
            f"{'; '.join(cells)}.")


# The one teacher every teachers part trains again (from the same data and seed): the only name two part files may
# both hold with other figures.
RETRAINED_TEACHER = "sft"
PROVENANCE_KEYS = ("commit", "device", "command")


def read_teachers_files(paths: list[Path], explanations: Path | None = None) -> dict | None:
    """The teachers files of several parts, in the order given, as one (``read_teachers_file`` each): their
    teachers and distills. RETRAINED_TEACHER, which every part trains and distils again, is taken from the later
    file (a warning says so); any other name two files hold must read the same there (a teacher is added once).
    The common block is computed from ``explanations`` (``keep``'s folder: the rows the students read, the
    questions every kept teacher explained) where given, with a warning where a kept teacher's commit is not the
    merged distill's; else it is the block of the last file that has one. None for no file."""
    if not paths:
        if explanations is not None:
            raise StudyError("--explanations needs --teachers: the teachers files it gives a common block")
        return None
    merged: dict = {"teachers": {}, "distills": {}}
    where = dict.fromkeys(PROVENANCE_KEYS)
    for path in paths:
        one = read_teachers_file(path)
        for kind in ("teachers", "distills"):
            for name, entry in one.get(kind, {}).items():
                held = merged[kind].get(name)
                if held is not None and _figures(held, where) != _figures(entry, where):
                    if name != RETRAINED_TEACHER:
                        raise StudyError(f"--teachers: {kind[:-1]} {name} is in two files with other figures (the "
                                         f"later: {path}): only {RETRAINED_TEACHER} is trained again by each part")
                    logger.warning("%s %s: taken from %s, the later part", kind[:-1], name, path)
                merged[kind][name] = entry
        if one.get("common"):
            merged["common"] = one["common"]
    if explanations is not None:
        rows = read_kept(explanations)
        common = rows_common_block(rows, _questions_in_all(rows))
        if common is None:
            raise StudyError(f"--explanations {explanations}: no question every kept teacher explained")
        merged["common"] = {**common, "from": str(explanations)}
        for name, entry in _read_manifest(explanations)["teachers"].items():
            distill = merged["distills"].get(name, {})
            if entry.get("commit") and distill.get("commit") and entry["commit"] != distill["commit"]:
                logger.warning("%s: kept at commit %s, but the teachers files' distill %s is from %s: its figures "
                               "are not the kept rows'", explanations, entry["commit"], name, distill["commit"])
    return merged


def tagged_teachers(paths: list[Path], tags: str) -> dict:
    """The teachers of several files for a plot, each file's named ``<name> <tag>`` (tags in the files' order): two
    runs of one seed (in bfloat16 and in float32, say), which ``read_teachers_files`` refuses to merge, side by
    side."""
    labels = [tag.strip() for tag in tags.split(",")]
    if len(labels) != len(paths) or not all(labels) or len(set(labels)) != len(labels):
        raise StudyError(f"--tags {tags}: one distinct label per teachers file ({len(paths)} given)")
    return {"teachers": {f"{name} {tag}": entry for path, tag in zip(paths, labels, strict=True)
                         for name, entry in read_teachers_file(path)["teachers"].items()}}


def read_teachers_file(path: Path | None) -> dict | None:
    """The teachers file ``write_teachers`` writes; None for no path."""
    if path is None:
        return None
    if not path.is_file():
        raise StudyError(f"--teachers {path}: no such file (bench/study_fair.py teachers <root> --out {path} "
                         "writes it)")
    try:
        teachers = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise StudyError(f"--teachers {path}: not JSON ({err.msg})") from err
    if not isinstance(teachers, dict) or not isinstance(teachers.get("teachers"), dict):
        raise StudyError(f"--teachers {path}: no \"teachers\" entry; pass the file bench/study_fair.py teachers "
                         "wrote")
    return teachers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/study_fair.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    summary = sub.add_parser("summarize", help="study.json and study_table.md from the eval folders")
    summary.add_argument("roots", nargs="+", type=Path)
    summary.add_argument("--out", type=Path, required=True)
    summary.add_argument("--gpu-minutes", type=float, default=None)
    summary.add_argument("--resamples", type=int, default=RESAMPLES)
    summary.add_argument("--seed", type=int, default=0)
    summary.add_argument("--teachers", type=Path, nargs="+", default=None,
                         help=f"the teachers file (bench/study_fair.py teachers) for each student's correlation, or "
                              f"one per part (merged, a later file's teacher of a name kept); default: "
                              f"{TEACHERS_FILE} in --out when there is one")
    summary.add_argument("--explanations", type=Path, default=None,
                         help="keep's folder: the teachers' common block from the rows the students read")
    summary.add_argument("--traces", type=Path, default=None,
                         help="the committed traces (study_data/gsm_symbolic_v2/traces.jsonl.gz): every traces run "
                              "must have read them")
    exporting = sub.add_parser("export", help="the few kilobytes of each eval run the summary needs")
    exporting.add_argument("root", type=Path)
    exporting.add_argument("--out", type=Path, required=True)
    exporting.add_argument("--suffix", default="")
    exporting.add_argument("--device", required=True)
    exporting.add_argument("--commit", required=True)
    exporting.add_argument("--command", required=True)
    asking = sub.add_parser("answered", help="exit 0 when a run's answers were exported (at --commit), else 1")
    asking.add_argument("answers", type=Path, help="export's --out folder")
    asking.add_argument("student")
    asking.add_argument("label", help="the run's file name without .json, e.g. rl_teacher_s0 or untrained_s0")
    asking.add_argument("--commit", default=None)
    tracing = sub.add_parser("traces", help="the right, uncut answers of an eval.split=train eval as traces.jsonl")
    tracing.add_argument("folder", type=Path)
    tracing.add_argument("--out", type=Path, required=True)
    teaching = sub.add_parser("teachers", help=f"the few kilobytes of each finished teacher and distill, added to "
                                               f"--out ({TEACHERS_FILE})")
    teaching.add_argument("root", type=Path)
    teaching.add_argument("--out", type=Path, required=True)
    teaching.add_argument("--device", required=True)
    teaching.add_argument("--commit", required=True)
    teaching.add_argument("--command", required=True)
    commons = sub.add_parser("common", help="each distill's rows of the questions every distill explained, as "
                                            "<out>/<name>.jsonl.gz")
    commons.add_argument("root", type=Path)
    commons.add_argument("--out", type=Path, required=True)
    keeping = sub.add_parser("keep", help="the rows common writes, for the repository: <out>/<name>.jsonl.xz and "
                                          f"<out>/{MANIFEST_FILE}")
    keeping.add_argument("root", type=Path)
    keeping.add_argument("--out", type=Path, required=True)
    keeping.add_argument("--replace", action="store_true", help="replace a distill kept already with other rows")
    restoring = sub.add_parser("restore", help="the files common writes (<out>/<name>.jsonl.gz), from the ones keep "
                                               "kept")
    restoring.add_argument("folder", type=Path, help="keep's --out folder")
    restoring.add_argument("--out", type=Path, required=True)
    drawing = sub.add_parser("teachers-plot", help="teachers.png: every RL teacher's held-out curves from the teachers "
                                                   "files of the parts")
    drawing.add_argument("teachers", type=Path, nargs="+", help="teachers files (bench/study_fair.py teachers)")
    drawing.add_argument("--out", type=Path, required=True, help="the PNG to write")
    drawing.add_argument("--tags", help="a label per teachers file, comma-separated, added to its teachers' names: "
                                        "draws two runs of one teacher side by side (e.g. bfloat16,float32)")
    checking = sub.add_parser("check-distilled", help="exit 2 where a file in <distilled> named as a kept teacher "
                                                      "holds other rows than the kept ones")
    checking.add_argument("folder", type=Path, help="keep's --out folder")
    checking.add_argument("distilled", type=Path, help="the part's distilled/ folder")
    checking.add_argument("--own", type=Path, help="a teachers part's <root>/teachers: a file that is its own "
                                                   "distill_<name>/distill.jsonl passes")
    checking.add_argument("--students", action="store_true", help="a students part: also every kept SFT sample "
                          "and the answer-only teacher's rows there, and no SFT sample there that is not kept")
    targeting = sub.add_parser("worked-target", help="the answer-only teacher's rows with the worked solution as "
                                                     "the student's target")
    targeting.add_argument("rows", type=Path, help="its distilled rows (JSON lines)")
    targeting.add_argument("--out", type=Path, required=True)
    rounding = sub.add_parser("rounded", help="the kept teachers that trained full bfloat16 or float16 weights "
                                              "(most of each step rounded away), one a line")
    rounding.add_argument("folder", type=Path, help="keep's --out folder")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s: %(message)s")
    try:
        if args.action == "answered":
            return 0 if is_answered(args.answers, args.student, args.label, args.commit) else 1
        if args.action == "traces":
            kept, answered = traces(args.folder, args.out)
            print(f"{args.out}: {kept} of {answered} training questions answered right within the cap, kept as traces")
            return 0
        if args.action == "export":
            for path in export(args.root, args.out, args.suffix,
                               {"device": args.device, "commit": args.commit, "command": args.command}):
                print(path)
            return 0
        if args.action == "teachers":
            added, kept, common = write_teachers(args.root, args.out, {"device": args.device, "commit": args.commit,
                                                                       "command": args.command})
            shared = "" if common is None else (f"; common: {common['questions']} questions of "
                                                f"{common['templates']} templates, {len(common['distills'])} distills")
            print(f"{args.out}: added {', '.join(added) or 'nothing'}; already there: {', '.join(kept) or 'none'}"
                  f"{shared}")
            return 0
        if args.action == "common":
            for path, rows in write_common(args.root, args.out):
                print(f"{path}: {rows} rows")
            return 0
        if args.action == "keep":
            for path, rows, state in keep(args.root, args.out, args.replace):
                print(f"{path}: {rows} rows, {state}")
            return 0
        if args.action == "teachers-plot":
            drawn = plot_teachers(tagged_teachers(args.teachers, args.tags) if args.tags
                                  else read_teachers_files(args.teachers), args.out)
            print(f"{args.out}: {', '.join(drawn)}")
            return 0
        if args.action == "worked-target":
            if not args.rows.is_file():
                raise StudyError(f"{args.rows}: no such file")
            lines = worked_target(args.rows.read_text().splitlines())
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(args.out, _text(lines))  # the bytes _kept_digests hashes of these rows
            print(f"{args.out}: {len(lines)} rows, the worked solution as the target")
            return 0
        if args.action == "rounded":
            print("".join(f"{name}\n" for name in rounded_teachers(args.folder)), end="")
            return 0
        if args.action == "check-distilled":
            wrong = check_distilled(args.folder, args.distilled, args.own)
            if args.students:
                wrong += check_students_inputs(args.folder, args.distilled)
            for line in wrong:
                print(f"error: {line}", file=sys.stderr)
            return 2 if wrong else 0
        if args.action == "restore":
            for path, rows in restore(args.folder, args.out):
                print(f"{path}: {rows} rows")
            return 0
        teachers_files = args.teachers or ([args.out / TEACHERS_FILE] if (args.out / TEACHERS_FILE).is_file() else [])
        teachers = read_teachers_files(teachers_files, args.explanations)
        if args.explanations is not None:
            check_read_kept(args.roots, args.explanations)
        if args.traces is not None:
            check_read_traces(args.roots, args.traces)
        students = summarize(read_arms(args.roots), args.resamples, args.seed, teachers)
    except (StudyError, UserError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    runs = provenance(args.roots)
    result = {"commit": sorted({r["commit"] for r in runs}), "device": sorted({r["device"] for r in runs}),
              "commands": sorted({r["command"] for r in runs}), "runs": runs, "gpu_minutes": args.gpu_minutes,
              "bootstrap": {"resamples": args.resamples, "seed": args.seed,
                            "over": ["seeds", "templates", "questions"]},
              "teachers": [str(path) for path in teachers_files] or None,
              "explanations": None if args.explanations is None else str(args.explanations),
              "traces": None if args.traces is None else str(args.traces),
              "students": students}
    result["requirements"] = requirements(students, result["commit"], rows_checked=args.explanations is not None,
                                          traces_checked=args.traces is not None)
    write_json(args.out / "study.json", result, indent=2)
    text = table(students) + requirements_line(result["requirements"])
    write_text(args.out / "study_table.md", text)
    if students:
        plot(students, args.out / "study.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
