"""Wall-clock time to a held-out reward: how much sooner one setting reaches what the default reaches.

    python bench/time_to_reward.py auto=<run>,<run>,<run> speed=<run>,<run>,<run> --baseline auto --target-step 200 \
        --out results/memory_speed/time_to_reward.json --device H100 --commit <sha> --command "<how it ran>"

Each run is a teacher_rlt run folder whose ``metrics.jsonl`` has held-out evaluations (``trainer.eval_strategy=steps``:
rows with ``eval_reward``) and each row's ``wall_time_seconds`` (seconds since its training began). The target is the
median, over the baseline arm's runs, of the held-out reward at ``--target-step``; a run reaches it at the first
evaluation whose reward is at least the target (its seconds and optimizer step are reported; a run that never does
is reported as such and left out of its arm's median). ``sooner`` is the baseline's median seconds over the arm's:
2.0 means the arm reached the target in half the time. Steps are not compared: a setting that feeds several
optimizer steps from one generation (``memory=speed``) takes steps of another size.

``curves``: per arm, the held-out reward at each step every run of the arm evaluated (median, lowest, highest over its
runs), and for every other arm whether its median stays within the baseline's spread over seeds:
``within_baseline_spread`` counts the steps both evaluated and names those outside. It compares like with like only
for an arm whose steps are the baseline's size (``placement=async``, one step off the policy), not ``memory=speed``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from rlt_mono.runs.atomic_write import write_json
from rlt_mono.runs.files import WALL_TIME_KEY
from rlt_mono.runs.outputs import EVAL_EVENT, METRICS_FILE, is_number, read_metrics


class TimeToRewardError(ValueError):
    """Runs that cannot answer the question (one line)."""


def held_out_curve(run: Path) -> list[tuple[int, float, float]]:
    """``(step, eval_reward, wall_time_seconds)`` of each held-out evaluation of a run, in step order."""
    path = run / METRICS_FILE
    if not path.is_file():
        raise TimeToRewardError(f"{run}: no {METRICS_FILE}")
    curve = [(int(row["step"]), float(row["eval_reward"]), float(row[WALL_TIME_KEY]))
             for row in read_metrics(path, EVAL_EVENT) if is_number(row.get("eval_reward"))
             and is_number(row.get(WALL_TIME_KEY))]
    if not curve:
        raise TimeToRewardError(f"{run}: no held-out evaluation with {WALL_TIME_KEY} (run with "
                                "trainer.eval_strategy=steps)")
    return sorted(curve)


def target_reward(runs: list[Path], step: int) -> float:
    """The median held-out reward of ``runs`` at ``step`` (each must have evaluated there)."""
    values = []
    for run in runs:
        at = [reward for s, reward, _ in held_out_curve(run) if s == step]
        if not at:
            raise TimeToRewardError(f"{run}: no held-out evaluation at step {step} (its steps: "
                                    f"{[s for s, _, _ in held_out_curve(run)]}); pass a --target-step it evaluated")
        values.append(at[0])
    return statistics.median(values)


def reached(run: Path, target: float) -> dict:
    """When ``run`` first reached ``target``: ``{"seconds", "step"}``, or ``{"reached": false, ...}``."""
    curve = held_out_curve(run)
    for step, reward, seconds in curve:
        if reward >= target:
            return {"run": str(run), "reached": True, "seconds": round(seconds, 1), "step": step,
                    "eval_reward": round(reward, 4)}
    return {"run": str(run), "reached": False, "best_eval_reward": round(max(r for _, r, _ in curve), 4),
            "last_step": curve[-1][0], "last_seconds": round(curve[-1][2], 1)}


def compare(arms: dict[str, list[Path]], baseline: str, target_step: int) -> dict:
    """Every arm's runs against the target the baseline arm sets (the module's doc)."""
    if baseline not in arms:
        raise TimeToRewardError(f"--baseline {baseline}: not among the arms ({', '.join(arms)})")
    target = target_reward(arms[baseline], target_step)
    result = {"target": {"eval_reward": round(target, 4), "from": f"median held-out reward of {baseline} at step "
                                                                   f"{target_step}"}, "arms": {}}
    for arm, runs in arms.items():
        rows = [reached(run, target) for run in runs]
        times = [row["seconds"] for row in rows if row["reached"]]
        result["arms"][arm] = {"runs": rows, "reached": f"{len(times)} of {len(rows)}",
                               "median_seconds": round(statistics.median(times), 1) if times else None}
    base = result["arms"][baseline]["median_seconds"]
    for entry in result["arms"].values():
        mine = entry["median_seconds"]
        entry["sooner"] = round(base / mine, 3) if base and mine else None
    return result


def curves(arms: dict[str, list[Path]], baseline: str) -> dict:
    """Each arm's held-out reward over its runs at each step they all evaluated, and where each arm's median leaves
    the baseline's lowest-to-highest band (the module's doc)."""
    result = {}
    for arm, runs in arms.items():
        by_run = [{step: reward for step, reward, _ in held_out_curve(run)} for run in runs]
        steps = sorted(set.intersection(*(set(rewards) for rewards in by_run)))
        result[arm] = {str(step): {"median": round(statistics.median(r[step] for r in by_run), 4),
                                   "lowest": round(min(r[step] for r in by_run), 4),
                                   "highest": round(max(r[step] for r in by_run), 4)} for step in steps}
    band = result[baseline]
    for arm, curve in result.items():
        if arm == baseline:
            continue
        shared = [step for step in curve if step in band]
        outside = [int(step) for step in shared
                   if not band[step]["lowest"] <= curve[step]["median"] <= band[step]["highest"]]
        curve["within_baseline_spread"] = {"steps": len(shared), "within": len(shared) - len(outside),
                                           "outside": outside}
    return result


def parse_arm(text: str) -> tuple[str, list[Path]]:
    name, sep, folders = text.partition("=")
    if not sep or not name or not folders:
        raise TimeToRewardError(f"arm {text!r}: expected name=<run>[,<run>...]")
    return name, [Path(folder) for folder in folders.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/time_to_reward.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("arms", nargs="+", help="name=<run folder>[,<run folder>...]")
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--target-step", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args(argv)
    try:
        arms = dict(parse_arm(text) for text in args.arms)
        result = compare(arms, args.baseline, args.target_step)
        result["curves"] = curves(arms, args.baseline)
    except TimeToRewardError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result.update(device=args.device, commit=args.commit, command=args.command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result, indent=1)
    print(f"target: held-out reward {result['target']['eval_reward']} ({result['target']['from']})")
    for arm, entry in result["arms"].items():
        spread = result["curves"][arm].get("within_baseline_spread")
        within = (f"; median within {args.baseline}'s spread at {spread['within']} of {spread['steps']} evaluated "
                  "steps") if spread else ""
        print(f"{arm}: reached {entry['reached']}, median {entry['median_seconds']} s, "
              f"sooner {entry['sooner']}{within}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
