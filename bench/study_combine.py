"""One study.json from the "Does it teach?" arms measured in different runs of the study (docs/STUDY.md).

A run of bench/study_gsm.sh may stop before every arm has run (a time limit, a crash), so an arm can exist
only in an earlier run's folders. This takes each arm from the run named for it, keeps where it came from, and
compares arms of different runs paired over the held-out questions they share (every run draws the same held-out
sets: data.seed and the held-out templates are fixed by cfgs/run_cfg/study_gsm_symbolic.yaml). Within a run the
figures are rlt_mono.study.aggregate's. An arm may also be taken a second time under a label
(``rl_teacher@150=<run>``: the RL teachers of a run that stopped RL at 150 steps): such an entry is listed, enters
the correlation, and is compared only with entries of the same label (``rl_teacher@best_correct -
sft_teacher@best_correct``). The
correlation is between a teacher's mean held-out reward and the held-out accuracy of the students trained on its
explanations: one point per seed where each seed has its own teacher (RL), one point per teacher where all seeds
share it (the SFT teacher, scored once), per held-out set. Usage:

    python bench/study_combine.py --run <name>=<seed folder>,<seed folder>... [--run ...] \
        --arm <arm>[@<label>]=<run name> ... --out <study.json> [--command "..."] [--device "..."]
"""

import argparse
from pathlib import Path

from rlt_mono.runs.atomic_write import write_json, write_text
from rlt_mono.study.aggregate import (
    HELD_OUT_SETS,
    STUDENT_ARMS,
    TEACHER_EVALS,
    arm_entry,
    pearson,
    pooled_over_seeds,
    question_means,
    read_seed,
    teacher_entry,
    values_by_seed,
)
from rlt_mono.study.eval_stats import RESAMPLES


def cross_run_difference(runs_a, step_a: str, runs_b, step_b: str, held_out: str) -> dict | None:
    """``b - a`` per shared question (each side averaged over its run's seeds), with its bootstrap interval."""
    a, b = (question_means(values_by_seed(runs, step, "correct", held_out))
            for runs, step in ((runs_a, step_a), (runs_b, step_b)))
    pooled = pooled_over_seeds({0: {q: b[q] - a[q] for q in b if q in a}})
    return None if pooled is None else {"mean": pooled["mean"], "ci95": pooled["ci95"],
                                        "questions": pooled["questions"]}


COMPARED = (("rl_teacher", "sft_teacher"), ("rl_teacher", "raw_traces"), ("rl_teacher", "base"),
            ("sft_teacher", "raw_traces"), ("sft_teacher", "base"), ("raw_traces", "base"))  # (b, a): b - a


def compared_pairs(labels: list[str]) -> list[tuple[str, str]]:
    """The ``(b, a)`` entry labels whose difference ``b - a`` is reported: the pairs of ``COMPARED`` that carry the
    same label (none, or the same ``@<label>``), in that order, unlabelled first."""
    suffixes = dict.fromkeys(label[len(label.split("@")[0]):] for label in labels)
    return [(b + suffix, a + suffix) for suffix in suffixes for b, a in COMPARED
            if b + suffix in labels and a + suffix in labels]


def teacher_student_points(teachers: list[dict], arms: list[dict]) -> list[dict]:
    """(teacher reward, student accuracy) points of each entry label that has both a teacher and a student arm: per
    seed where the teacher ran in every seed its students did, else one point (the teacher's mean reward, the
    students' mean accuracy over their seeds)."""
    arm_of = {arm["label"]: arm for arm in arms}
    points = []
    for teacher in teachers:
        arm = arm_of.get(teacher["label"])
        for held_out in HELD_OUT_SETS:
            rewards = teacher[f"held_out_{held_out}"]
            student = None if arm is None else arm[f"held_out_{held_out}"]
            if rewards is None or student is None:
                continue
            by_seed, accuracy = rewards["reward"]["per_seed"], student["per_seed"]
            point = {"teacher": teacher["label"], "held_out": held_out}
            if set(accuracy) <= set(by_seed):
                points += [{**point, "seeds": [s], "teacher_reward": by_seed[s], "student_accuracy": accuracy[s]}
                           for s in accuracy]
            else:
                points.append({**point, "seeds": sorted(accuracy), "teacher_reward": rewards["reward"]["mean"],
                               "student_accuracy": sum(accuracy.values()) / len(accuracy)})
    return points


def correlation(points: list[dict]) -> dict:
    """Pearson r of the points, over all of them and per held-out set (None with fewer than 3)."""
    def r(chosen):
        return pearson([p["teacher_reward"] for p in chosen], [p["student_accuracy"] for p in chosen])
    return {"pearson": r(points), **{f"pearson_{h}": r([p for p in points if p["held_out"] == h])
                                     for h in HELD_OUT_SETS}, "points": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="<name>=<seed folder>,<seed folder>...")
    parser.add_argument("--arm", action="append", required=True, help="<arm or teacher>=<run name>")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--command", action="append", default=[], dest="commands")
    parser.add_argument("--device")
    args = parser.parse_args()
    runs = {name: [read_seed(Path(f)) for f in folders.split(",")]
            for name, folders in (item.split("=", 1) for item in args.run)}
    entries = dict(item.split("=", 1) for item in args.arm)  # label -> run
    unknown = [label for label in entries if label.split("@")[0] not in STUDENT_ARMS]
    if unknown:
        parser.error(f"unknown arm {unknown}: the arms are {list(STUDENT_ARMS)}, optionally with @<label>")
    unnamed = sorted({run for run in entries.values() if run not in runs})
    if unnamed:
        parser.error(f"--arm names run {unnamed}, which no --run gives: the runs are {list(runs)}")
    arms = [{**arm_entry(runs[run], label.split("@")[0], RESAMPLES, 0), "label": label, "run": run}
            for label, run in entries.items()]
    teachers = [{**teacher_entry(runs[run], label.split("@")[0], RESAMPLES, 0), "label": label, "run": run}
                for label, run in entries.items() if label.split("@")[0] in TEACHER_EVALS]
    differences = {}
    for b, a in compared_pairs(list(entries)):
        step_a, step_b = (STUDENT_ARMS[label.split("@")[0]][0] for label in (a, b))
        for held_out in HELD_OUT_SETS:
            differences[f"{held_out}: {b} ({entries[b]}) - {a} ({entries[a]})"] = cross_run_difference(
                runs[entries[a]], step_a, runs[entries[b]], step_b, held_out)
    study = {"runs": {name: [str(seed.folder) for seed in seeds] for name, seeds in runs.items()},
             "arms": arms, "teachers": teachers, "differences": differences,
             "correlation": correlation(teacher_student_points(teachers, arms)), "commands": args.commands,
             "device": args.device}
    write_json(args.out, study, indent=1)
    table = ["| arm | run | seeds | held-out templates [95% CI] | held-out instances [95% CI] |",
             "| --- | --- | --- | --- | --- |"]
    for arm in arms:
        cells = [f"{s['accuracy']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]" if s else "—"
                 for s in (arm["held_out_templates"], arm["held_out_instances"])]
        table.append(f"| {arm['label']} | {arm['run']} | {', '.join(map(str, arm['seeds'])) or '—'} | "
                     f"{cells[0]} | {cells[1]} |")
    table += ["", "| difference, paired over questions | mean [95% CI] | questions |", "| --- | --- | --- |"]
    table += [f"| {name} | {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | {d['questions']} |"
              for name, d in differences.items() if d]
    r = study["correlation"]
    table += ["", "Teacher reward vs its students' accuracy, Pearson r: " + ", ".join(
        f"{key.removeprefix('pearson').strip('_') or 'both sets'} {'—' if r[key] is None else f'{r[key]:+.2f}'}"
        for key in ("pearson", *(f"pearson_{h}" for h in HELD_OUT_SETS))) + f" ({len(r['points'])} points)."]
    table += ["", "| teacher | held-out | seeds | teacher reward | student accuracy |",
              "| --- | --- | --- | --- | --- |"]
    table += [f"| {p['teacher']} | {p['held_out']} | {', '.join(map(str, p['seeds']))} | {p['teacher_reward']:.2f} | "
              f"{p['student_accuracy']:.3f} |" for p in r["points"]]
    write_text(args.out.with_name("study_table.md"), "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
