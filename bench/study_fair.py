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
    python bench/study_fair.py outputs <root> --out study_data/gsm_symbolic_v2/outputs
    python bench/study_fair.py thoughts study_data/gsm_symbolic_v2/answers \
        --outputs study_data/gsm_symbolic_v2/outputs --explanations study_data/gsm_symbolic_v2/explanations \
        --out results/study_gsm_symbolic_v2
    python bench/study_fair.py duplicates --out study_data/gsm_symbolic_v2/heldout_near_duplicates.json
    python bench/study_fair.py distinct study_data/gsm_symbolic_v2/answers \
        --duplicates study_data/gsm_symbolic_v2/heldout_near_duplicates.json \
        --out results/study_gsm_symbolic_v2/distinct_instances.json

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

``duplicates`` and ``distinct`` are a declared sensitivity analysis, not the primary endpoint: ``duplicates`` finds
the held-out instances whose template and numbers (in order) are a training question's, only names and nouns
changed (near-duplicates), in the split the study's evals read (data=gsm_symbolic, loaded through rlt_mono), and
whether a match is among the questions the teachers explained (``--explanations``); ``distinct`` summarizes the
answers (``summarize``'s figures, held-out instances only) without those questions and on them alone.

The code is in the package bench/study/, imported as ``study`` (Python puts a script's folder, bench/, on the path):
``layout`` (the study's names and files), ``answers`` (the students' answers: ``export``, ``answered``, ``traces``),
``kept`` (the explanations the students read: ``common``, ``keep``, ``restore``, ``check-distilled``,
``worked-target``, ``rounded``), ``teachers`` (``teachers`` and the teachers files), ``thoughts`` (``outputs``,
``thoughts``: the students' texts and their thoughts graded), ``duplicates`` (``duplicates``,
``distinct``), ``stats`` (the bootstrap, the seeds' t interval, the
correlations), ``summary`` (``summarize``'s figures) and ``report`` (study_table.md, study.png, teachers.png). This
file is the command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from bench_mono import code_commit
from study.answers import (
    check_read_kept,
    check_read_traces,
    export,
    is_answered,
    provenance,
    read_arms,
    traces,
    where_ran,
)
from study.duplicates import (
    HELD_OUT,
    distinct_figures,
    duplicates_record,
    explained_ids,
    read_duplicates,
    study_split,
)
from study.duplicates import table as table_of_distinct
from study.kept import (
    check_distilled,
    check_students_inputs,
    keep,
    restore,
    rounded_teachers,
    worked_target,
    write_common,
)
from study.layout import MANIFEST_FILE, TEACHERS_FILE, StudyError, _text
from study.report import plot, plot_teachers, requirements_line, table
from study.summary import requirements, summarize
from study.teachers import read_teachers_files, tagged_teachers, write_teachers
from study.thoughts import graded_runs, summarize_thoughts, teachers_figures, write_outputs
from study.thoughts import table as table_of_thoughts

from rlt_mono.errors import UserError
from rlt_mono.runs.atomic_write import write_bytes, write_json, write_text
from rlt_mono.study.eval_stats import RESAMPLES

# The explanations the repository keeps (bench/study_fair.py keep's --out): the questions the teachers explained.
EXPLANATIONS = Path("study_data/gsm_symbolic_v2/explanations")


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per action, each with its arguments."""
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
    keeping.add_argument("--as", dest="names", action="append", default=[], metavar="DISTILL=NAME",
                         help="keep the root's DISTILL under NAME (e.g. rl_s0=rl_full_s0: the 48K RL teacher)")
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
    writing = sub.add_parser("outputs", help="each eval run's answers as text: <out>/<student>/<arm>_s<seed>.jsonl.xz")
    writing.add_argument("root", type=Path)
    writing.add_argument("--out", type=Path, required=True)
    thinking = sub.add_parser("thoughts", help="the taught students' thoughts graded beside their solutions: "
                                               "thoughts.json and thoughts_table.md in --out")
    thinking.add_argument("answers", type=Path, help="export's --out folder")
    thinking.add_argument("--outputs", type=Path, required=True, help="outputs' --out folder")
    thinking.add_argument("--explanations", type=Path, default=None,
                          help="keep's folder: also grade each kept teacher's explanations as answers")
    thinking.add_argument("--out", type=Path, required=True)
    thinking.add_argument("--resamples", type=int, default=RESAMPLES)
    thinking.add_argument("--seed", type=int, default=0)
    duplicating = sub.add_parser("duplicates", help="the held-out instances with a training question's template and "
                                                    "numbers (near-duplicates), as a JSON file")
    duplicating.add_argument("--out", type=Path, required=True)
    duplicating.add_argument("--explanations", type=Path, default=EXPLANATIONS,
                             help=f"keep's folder: the questions the teachers explained (default {EXPLANATIONS})")
    distinguishing = sub.add_parser("distinct", help="summarize's held-out-instance figures without the "
                                                     "near-duplicates and on them alone: a JSON file and its .md")
    distinguishing.add_argument("roots", nargs="+", type=Path, help="export's --out folder(s), or study roots")
    distinguishing.add_argument("--duplicates", type=Path, required=True, help="duplicates' --out file")
    distinguishing.add_argument("--out", type=Path, required=True, help="the JSON file to write (its .md beside it)")
    distinguishing.add_argument("--resamples", type=int, default=RESAMPLES)
    distinguishing.add_argument("--seed", type=int, default=0)
    return parser


def _duplicates(args: argparse.Namespace) -> int:
    """``duplicates``: the near-duplicates of the study's split (``duplicates_record``) with the commit, command and
    data config, as ``args.out``."""
    training, held_out, data = study_split()
    record = duplicates_record(training, held_out, explained_ids(args.explanations))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {"commit": code_commit(mark_changes=True),
                          "command": f"python bench/study_fair.py duplicates --out {args.out} "
                                     f"--explanations {args.explanations}",
                          "data": data, "explanations": str(args.explanations), **record}, indent=1)
    counts = record["counts"]
    print(f"{args.out}: {counts['near_duplicates']} of {counts[HELD_OUT]} held-out instances are near-duplicates of "
          f"a training question; {counts['near_duplicates_of_explained']} match one of the {counts['explained']} "
          f"the teachers explained, {counts['same_steps']} repeat a match's steps")
    return 0


def _distinct(args: argparse.Namespace) -> int:
    """``distinct``: ``distinct_figures`` with where the runs ran and how, as ``args.out`` and its table beside it."""
    saved = read_duplicates(args.duplicates)
    duplicates = saved["near_duplicates"]
    students = distinct_figures(read_arms(args.roots), duplicates, args.resamples, args.seed)
    counts = {**saved.get("counts", {}), "near_duplicates": len(duplicates),
              "near_duplicates_of_explained": sum(bool(entry.get("explained")) for entry in duplicates.values())}
    runs = provenance(args.roots)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {
        **where_ran(runs),
        "analysis": f"python bench/study_fair.py distinct {' '.join(map(str, args.roots))} --duplicates "
                    f"{args.duplicates} --out {args.out} --resamples {args.resamples} --seed {args.seed} (CPU)",
        "analysis_commit": code_commit(mark_changes=True),
        "sensitivity": "a declared sensitivity analysis, not the primary endpoint (study.json's held-out instances): "
                       "the held-out instances without the near-duplicates of a training question, and those alone",
        "duplicates": {"file": str(args.duplicates), "commit": saved.get("commit"), "numbers": saved.get("numbers"),
                       "counts": counts},
        "bootstrap": {"resamples": args.resamples, "seed": args.seed, "over": ["seeds", "templates", "questions"]},
        "students": students}, indent=1)
    text = table_of_distinct(students, counts)
    write_text(args.out.with_suffix(".md"), text)
    print(text)
    return 0


def _thoughts(args: argparse.Namespace) -> int:
    """``thoughts``: thoughts.json (where the runs ran, the bootstrap, per student ``summarize_thoughts``, with
    ``--explanations`` the kept teachers' ``teachers_figures``) and thoughts_table.md in ``args.out``."""
    students = summarize_thoughts(graded_runs(args.answers, args.outputs), args.resamples, args.seed)
    teachers = None if args.explanations is None else teachers_figures(args.explanations, args.resamples, args.seed)
    graded = {(student, arm, seed) for student, entry in students.items() for arm, figures in entry["arms"].items()
              for seed in figures["seeds"]}
    runs = [run for run in provenance([args.answers]) if (run["student"], run["arm"], run["seed"]) in graded]
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "thoughts.json", {
        **where_ran(runs), "runs": runs,
        "analysis": f"python bench/study_fair.py thoughts {args.answers} --outputs {args.outputs} --out {args.out}"
                    + ("" if args.explanations is None else f" --explanations {args.explanations}") + " (CPU)",
        "analysis_commit": code_commit(mark_changes=True),
        "bootstrap": {"resamples": args.resamples, "seed": args.seed, "over": ["seeds", "templates", "questions"]},
        "students": students, "teachers": teachers}, indent=2)
    text = table_of_thoughts(students, teachers)
    write_text(args.out / "thoughts_table.md", text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
            names = dict(pair.split("=", 1) for pair in args.names if "=" in pair)
            if len(names) != len(args.names) or not all(names) or not all(names.values()):
                raise StudyError(f"--as {' '.join(args.names)}: each DISTILL=NAME, both named")
            for path, rows, state in keep(args.root, args.out, args.replace, names):
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
        if args.action == "outputs":
            for path in write_outputs(args.root, args.out):
                print(path)
            return 0
        if args.action == "thoughts":
            return _thoughts(args)
        if args.action == "duplicates":
            return _duplicates(args)
        if args.action == "distinct":
            return _distinct(args)
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
    result = {**where_ran(runs), "runs": runs, "gpu_minutes": args.gpu_minutes,
              "bootstrap": {"resamples": args.resamples, "seed": args.seed,
                            "over": ["seeds", "templates", "questions"]},
              "teachers": [str(path) for path in teachers_files] or None,
              "explanations": None if args.explanations is None else str(args.explanations),
              "traces": None if args.traces is None else str(args.traces),
              "students": students}
    result["requirements"] = requirements(students, result["commit"], rows_checked=args.explanations is not None,
                                          traces_checked=args.traces is not None, teachers=teachers)
    write_json(args.out / "study.json", result, indent=2)
    text = table(students) + requirements_line(result["requirements"])
    write_text(args.out / "study_table.md", text)
    if students:
        plot(students, args.out / "study.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
