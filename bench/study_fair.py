"""The fair study's summary (docs/STUDY.md): every arm's held-out accuracy with intervals over seeds, templates and
questions, the positive control, and the paired differences, from the eval folders bench/study_fair.sh writes.

    python bench/study_fair.py export <root> --out results/study_gsm_symbolic_v2/answers [--suffix _lr1e-5] \
        --device nvidia-h200 --commit <sha> --command "<how it ran>"
    python bench/study_fair.py summarize results/study_gsm_symbolic_v2/answers --out results/study_gsm_symbolic_v2
    python bench/study_fair.py traces <root>/traces/eval --out <root>/traces/traces.jsonl

A root holds ``<student>/<arm>[_s<seed>]/eval/eval_rows.jsonl`` (one line per held-out question: ``heldout`` set,
``template``, ``correct``, ``capped``). ``export`` keeps of each what the summary needs, in a few kilobytes
(``<student>/<arm><suffix>_s<seed>.json``: question hashes, sets, templates, right/wrong, cut at the cap, and where
it ran), so the study's summary is recomputed from committed files as its parts are run at different times. An arm's
accuracy on a held-out set is the mean over its seeds of the mean over questions. Its interval is a percentile
bootstrap that resamples, in turn, seeds (with replacement), templates (clusters: the questions of one template
share wording and method) and questions within each drawn template. A difference between two arms of one student
resamples the same templates and questions for both (paired over questions) and each arm's seeds apart. Writes
``study.json`` and ``study_table.md`` into ``--out``.

``traces`` makes the larger-model traces (the analog of the RLT paper's larger-model thoughts: the teacher's SFT
warm-up data and the traces student arm) from an eval folder run with ``eval.split=train`` and
``eval.student_prompt=plain``: one line per training question the model answered right within the token cap, with
``trace``, its answer less everything from its last "The answer is" on (the worked solution states the answer)
and the markup opening that sentence.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from rlt_mono.read_source import module_constant

SETS = {"instances": "held_out_instances", "templates": "held_out_templates"}
SHORT_SETS = {name[0]: name for name in SETS}  # export writes each row's set as its first letter
# The positive control: students trained on the dataset's own worked solutions against the better untrained prompt,
# on held-out instances of the training templates, must gain at least this much with the interval above zero.
CONTROL_ARM, UNTRAINED_ARMS, CONTROL_MARGIN = "worked", ("untrained", "untrained_plain"), 0.05
# The comparisons the study exists for, each as (arm, minus arm), per student, wherever both arms were run.
DIFFERENCES = (("worked", "untrained"), ("worked", "untrained_plain"), ("rl_teacher", "sft_teacher"),
               ("rl_teacher", "worked"), ("rl_teacher", "traces"), ("rl_teacher", "rl_teacher_answer_only"))
_SEEDED = re.compile(r"^(?P<arm>.+)_s(?P<seed>\d+)$")
# The sentence a plain-prompt answer ends with (rlt_mono.evaluate), the markup that may open it on its line, and
# what a traces eval must have been run with.
THE_ANSWER_IS = module_constant("rlt_mono.evaluate", "THE_ANSWER_IS")
_SENTENCE_MARKUP = re.compile(r"[ \t*#_>-]*\Z")
TRACES_EVAL = {"eval.split": "train", "eval.student_prompt": "plain"}
# A trace line's columns: the row's own, then the trace.
TRACE_COLUMNS = ("question", "solution", "answer", "template")


class StudyError(ValueError):
    """What the user must fix: one line."""


def _question_id(question: str) -> str:
    return hashlib.sha256(" ".join(question.split()).encode()).hexdigest()[:12]


def _eval_runs(root: Path) -> list[tuple[str, str, int, list[dict]]]:
    """``(student, arm, seed, rows)`` of every eval folder under ``root``, each row keyed by its question's id."""
    runs = []
    for rows_file in sorted(root.glob("*/*/eval/eval_rows.jsonl")):
        folder = rows_file.parent.parent
        match = _SEEDED.match(folder.name)
        arm, seed = (match["arm"], int(match["seed"])) if match else (folder.name, 0)
        rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
        if not rows:
            raise StudyError(f"{rows_file} is empty: that eval did not finish; run its part again")
        runs.append((folder.parent.name, arm, seed, [{**row, "question": _question_id(row["question"])}
                                                     for row in rows]))
    return runs


def _exported_runs(root: Path) -> list[tuple[str, str, int, list[dict]]]:
    """The same from ``export``'s files under ``root``."""
    runs = []
    for path in sorted(root.glob("*/*.json")):
        match = _SEEDED.match(path.stem)
        if match is None:
            continue
        saved = json.loads(path.read_text())
        rows = [{"question": q, "heldout": SHORT_SETS[h], "template": t, "correct": c == "1", "capped": x == "1"}
                for q, h, t, c, x in zip(saved["question"], saved["heldout"], saved["template"], saved["correct"],
                                         saved["capped"], strict=True)]
        runs.append((path.parent.name, match["arm"], int(match["seed"]), rows))
    return runs


def read_arms(roots: list[Path]) -> dict[str, dict[str, dict[int, list[dict]]]]:
    """``{student: {arm: {seed: eval rows}}}`` from every ``<root>/<student>/<arm>[_s<seed>]/eval`` and every
    exported ``<root>/<student>/<arm>_s<seed>.json``."""
    arms: dict[str, dict[str, dict[int, list[dict]]]] = {}
    for root in roots:
        for student, arm, seed, rows in [*_eval_runs(root), *_exported_runs(root)]:
            seeds = arms.setdefault(student, {}).setdefault(arm, {})
            if seed in seeds:
                raise StudyError(f"{root}: {student}/{arm} seed {seed} is there twice; pass each run once")
            seeds[seed] = rows
    if not arms:
        raise StudyError(f"no <student>/<arm>/eval/eval_rows.jsonl under {', '.join(map(str, roots))}: pass the "
                         "folder bench/study_fair.sh wrote")
    return arms


def provenance(roots: list[Path]) -> list[dict]:
    """Where each exported run ran: ``student``, ``arm``, ``seed``, ``device``, ``commit``, ``command``."""
    runs = []
    for root in roots:
        for path in sorted(root.glob("*/*.json")):
            match = _SEEDED.match(path.stem)
            if match:
                saved = json.loads(path.read_text())
                runs.append({"student": path.parent.name, "arm": match["arm"], "seed": int(match["seed"]),
                             **{key: saved.get(key, "?") for key in ("device", "commit", "command")}})
    return runs


def export(root: Path, out: Path, suffix: str, where: dict) -> list[Path]:
    """Each eval run under ``root`` as ``out/<student>/<arm><suffix>_s<seed>.json``; refuses to overwrite one."""
    written = []
    for student, arm, seed, rows in _eval_runs(root):
        rows = [row for row in rows if row.get("heldout") in SETS and row.get("correct") is not None]
        path = out / student / f"{arm}{suffix}_s{seed}.json"
        if path.exists():
            raise StudyError(f"{path} exists: a run is exported once (choose another --suffix, or delete it)")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            **where, "question": [row["question"] for row in rows],
            "heldout": "".join(row["heldout"][0] for row in rows), "template": [row.get("template") for row in rows],
            "correct": "".join("1" if row["correct"] else "0" for row in rows),
            "capped": "".join("1" if row.get("capped") else "0" for row in rows)}) + "\n")
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
    out.write_text("".join(json.dumps(row) + "\n" for row in kept))
    return len(kept), len(rows)


def _matrix(per_seed: dict[int, list[dict]], held_out: str) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Correctness (seeds x questions, questions in one sorted order), the questions, and each one's template."""
    by_seed = {seed: {row["question"]: row for row in rows if row.get("heldout") == held_out
                      and row.get("correct") is not None} for seed, rows in per_seed.items()}
    questions = sorted(set.intersection(*(set(rows) for rows in by_seed.values())))
    first = next(iter(by_seed.values()))
    templates = np.array([first[q].get("template", -1) for q in questions])
    correct = np.array([[float(by_seed[s][q]["correct"]) for q in questions] for s in sorted(by_seed)])
    return correct, questions, templates


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


def _interval(samples: np.ndarray) -> list[float]:
    return [round(float(np.percentile(samples, 2.5)), 4), round(float(np.percentile(samples, 97.5)), 4)]


def summarize(arms: dict, resamples: int, seed: int) -> dict:
    """Per student: every arm's accuracy per held-out set, and the differences of ``DIFFERENCES``."""
    rng = np.random.default_rng(seed)
    students = {}
    for student, per_arm in sorted(arms.items()):
        entry = {"arms": {}, "differences": {}}
        for held_out, name in SETS.items():
            matrices = {arm: _matrix(per_seed, held_out) for arm, per_seed in per_arm.items()}
            matrices = {arm: m for arm, m in matrices.items() if m[1]}
            if not matrices:
                continue
            shared = sorted(set.intersection(*(set(m[1]) for m in matrices.values())))
            keep = {arm: np.isin(m[1], shared) for arm, m in matrices.items()}
            templates = next(iter(matrices.values()))[2][keep[next(iter(matrices))]]
            weights = _question_weights(templates, resamples, rng)
            boot = {}
            for arm, (correct, _, _) in matrices.items():
                correct = correct[:, keep[arm]]
                boot[arm] = (weights * _seed_means(correct, resamples, rng)).sum(1) / weights.sum(1)
                capped = [row.get("capped") for rows in per_arm[arm].values() for row in rows
                          if row.get("heldout") == held_out]
                entry["arms"].setdefault(arm, {"seeds": sorted(per_arm[arm])})[name] = {
                    "accuracy": round(float(correct.mean()), 4), "ci95": _interval(boot[arm]),
                    "questions": int(correct.shape[1]), "templates": int(len(np.unique(templates))),
                    "per_seed": [round(float(x), 4) for x in correct.mean(axis=1)],
                    "capped_frac": round(float(np.mean([bool(c) for c in capped])), 4) if capped else None}
            for arm, minus in DIFFERENCES:
                if arm in boot and minus in boot:
                    point = entry["arms"][arm][name]["accuracy"] - entry["arms"][minus][name]["accuracy"]
                    entry["differences"].setdefault(f"{arm} - {minus}", {})[name] = {
                        "difference": round(point, 4), "ci95": _interval(boot[arm] - boot[minus])}
        entry["positive_control"] = positive_control(entry)
        students[student] = entry
    return students


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


def table(students: dict) -> str:
    """study_table.md: one row per student and arm."""
    lines = ["| student | arm | seeds | held-out templates | held-out instances | answers cut at the cap |",
             "| --- | --- | --- | --- | --- | --- |"]
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
            lines.append(f"| {student} | {arm} | {', '.join(map(str, figures['seeds']))} | {cells[0]} | {cells[1]} | "
                         f"{cut} |")
        control = entry.get("positive_control")
        if control:
            lines.append("")
            low, high = control["ci95"]
            lines.append(f"Positive control ({student}): {control['arm']} - {control['baseline']} on "
                         f"{control['set'].replace('_', ' ')}: {control['difference']:+.3f} [{low:+.3f}, {high:+.3f}]: "
                         f"{'passes' if control['passes'] else 'FAILS'} ({control['rule']}).")
        for pair, sets in entry["differences"].items():
            for name, d in sets.items():
                lines.append(f"- {student}, {pair}, {name.replace('_', ' ')}: {d['difference']:+.3f} "
                             f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/study_fair.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    summary = sub.add_parser("summarize", help="study.json and study_table.md from the eval folders")
    summary.add_argument("roots", nargs="+", type=Path)
    summary.add_argument("--out", type=Path, required=True)
    summary.add_argument("--gpu-minutes", type=float, default=None)
    summary.add_argument("--resamples", type=int, default=2000)
    summary.add_argument("--seed", type=int, default=0)
    exporting = sub.add_parser("export", help="the few kilobytes of each eval run the summary needs")
    exporting.add_argument("root", type=Path)
    exporting.add_argument("--out", type=Path, required=True)
    exporting.add_argument("--suffix", default="")
    exporting.add_argument("--device", required=True)
    exporting.add_argument("--commit", required=True)
    exporting.add_argument("--command", required=True)
    tracing = sub.add_parser("traces", help="the right, uncut answers of an eval.split=train eval as traces.jsonl")
    tracing.add_argument("folder", type=Path)
    tracing.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.action == "traces":
            kept, answered = traces(args.folder, args.out)
            print(f"{args.out}: {kept} of {answered} training questions answered right within the cap, kept as traces")
            return 0
        if args.action == "export":
            for path in export(args.root, args.out, args.suffix,
                               {"device": args.device, "commit": args.commit, "command": args.command}):
                print(path)
            return 0
        students = summarize(read_arms(args.roots), args.resamples, args.seed)
    except StudyError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    runs = provenance(args.roots)
    result = {"commit": sorted({r["commit"] for r in runs}), "device": sorted({r["device"] for r in runs}),
              "commands": sorted({r["command"] for r in runs}), "runs": runs, "gpu_minutes": args.gpu_minutes,
              "bootstrap": {"resamples": args.resamples, "seed": args.seed,
                            "over": ["seeds", "templates", "questions"]},
              "students": students}
    (args.out / "study.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "study_table.md").write_text(table(students))
    print(table(students))
    return 0


if __name__ == "__main__":
    sys.exit(main())
