"""One study.json from the "Does it teach?" arms measured in different device leases (docs/STUDY.md).

A lease may end before every arm has run (the GPU machine is lent for 30 minutes), so an arm can exist only in an
earlier lease's folders. This takes each arm from the lease named for it, keeps where it came from, and compares
arms of different leases paired over the held-out questions they share (every lease draws the same held-out sets:
data.seed and the held-out templates are fixed by cfgs/run_cfg/study_gsm_symbolic.yaml). Within a lease the
figures are rlt_mono.study's. Usage:

    python bench/study_combine.py --lease <name>=<seed folder>,<seed folder>... [--lease ...] \
        --arm <arm>=<lease name> ... --out <study.json> [--command "..."] [--device "..."]
"""

import argparse
import json
from pathlib import Path

from rlt_mono.study import (
    HELD_OUT_SETS,
    STUDENT_ARMS,
    TEACHER_EVALS,
    arm_entry,
    pooled_over_seeds,
    question_means,
    read_seed,
    teacher_entry,
    values_by_seed,
)


def cross_lease_difference(runs_a, step_a: str, runs_b, step_b: str, held_out: str) -> dict | None:
    """``b - a`` per shared question (each side averaged over its lease's seeds), with its bootstrap interval."""
    a, b = (question_means(values_by_seed(runs, step, "correct", held_out))
            for runs, step in ((runs_a, step_a), (runs_b, step_b)))
    pooled = pooled_over_seeds({0: {q: b[q] - a[q] for q in b if q in a}})
    return None if pooled is None else {"mean": pooled["mean"], "ci95": pooled["ci95"],
                                        "questions": pooled["questions"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease", action="append", required=True, help="<name>=<seed folder>,<seed folder>...")
    parser.add_argument("--arm", action="append", required=True, help="<arm or teacher>=<lease name>")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--command", action="append", default=[], dest="commands")
    parser.add_argument("--device")
    args = parser.parse_args()
    leases = {name: [read_seed(Path(f)) for f in folders.split(",")]
              for name, folders in (item.split("=", 1) for item in args.lease)}
    chosen = dict(item.split("=", 1) for item in args.arm)
    arms = [{**arm_entry(leases[chosen[name]], name, 2000, 0), "lease": chosen[name]}
            for name in STUDENT_ARMS if name in chosen]
    teachers = [{**teacher_entry(leases[chosen[name]], name, 2000, 0), "lease": chosen[name]}
                for name in TEACHER_EVALS if name in chosen]
    differences = {}
    for b, a in (("rl_teacher", "sft_teacher"), ("rl_teacher", "raw_traces"), ("rl_teacher", "base"),
                 ("sft_teacher", "raw_traces"), ("sft_teacher", "base"), ("raw_traces", "base")):
        if a in chosen and b in chosen:
            for held_out in HELD_OUT_SETS:
                differences[f"{held_out}: {b} ({chosen[b]}) - {a} ({chosen[a]})"] = cross_lease_difference(
                    leases[chosen[a]], STUDENT_ARMS[a][0], leases[chosen[b]], STUDENT_ARMS[b][0], held_out)
    study = {"leases": {name: [str(run.folder) for run in runs] for name, runs in leases.items()},
             "arms": arms, "teachers": teachers, "differences": differences, "commands": args.commands,
             "device": args.device}
    args.out.write_text(json.dumps(study, indent=1) + "\n")
    table = ["| arm | lease | seeds | held-out templates [95% CI] | held-out instances [95% CI] |",
             "| --- | --- | --- | --- | --- |"]
    for arm in arms:
        cells = [f"{s['accuracy']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]" if s else "—"
                 for s in (arm["held_out_templates"], arm["held_out_instances"])]
        table.append(f"| {arm['name']} | {arm['lease']} | {', '.join(map(str, arm['seeds'])) or '—'} | "
                     f"{cells[0]} | {cells[1]} |")
    table += ["", "| difference, paired over questions | mean [95% CI] | questions |", "| --- | --- | --- |"]
    table += [f"| {name} | {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | {d['questions']} |"
              for name, d in differences.items() if d]
    args.out.with_name("study_table.md").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
