"""The speed benchmarks' summaries from offline_host/speed.sh's raw results (docs/PERFORMANCE.md, "Speed").

``--target 05b`` (``results/speed_05b/``):
- ``pairs.json``: the rlt_mono and plain-TRL arms of ``pairs_raw.json`` taken two by two in the order they ran (the
  order alternates: rlt,trl then trl,rlt), each pair's ratio ``rlt / trl`` of median step seconds, and the median
  ratio (goal: <= 1.0); a last arm whose partner never ran (the script stopped) is listed apart (``unpaired_arms``).
- ``speed.json``: rlt_mono at ``memory=speed`` (``speed_raw.json``) against the pairs' rlt arms;
  ``speed_liger.json`` / ``speed_noliger.json`` the same for a run with ``trainer.use_liger_kernel`` set the other
  way (``speed_liger_raw.json`` / ``speed_noliger_raw.json``), where there is one. A speed run's steps are not alike
  (the step that generates also makes the completions of the next ones), so its figure is the mean step over whole
  generations: the steps from the second generation's first step to the step before the third's, i.e. one full
  generation cycle after the warm-up one. Completion tokens per second of the whole step = completions per step x
  completion length / that mean (goal: >= 3x the default's, the pairs' rlt arms' median step).

``--target 7b`` (``results/speed_7b/step.json``): each run of ``step_<arm>.json`` (``arm``: manual, noalign, noliger,
auto, speed) with its median step and phase seconds (steps after the first), the roofline of each phase
(``bench/roofline.py``) and the ratios (goal: step <= 1.3x its roofline). A speed run's median step mixes the steps
that generate with those that only train: read its step_seconds.

    python bench/speed_summary.py <folder with the raw JSON> --target 05b|7b --out results/speed_<target> \
        --commit <sha> --device H200 --command "bash offline_host/speed.sh start <target> ..."
"""

import argparse
import json
import statistics
from pathlib import Path

from roofline import DEVICES, PHASES, OneLineParser, Work, roofline

from rlt_mono.memory.model import QWEN25_ARCHS, Arch
from rlt_mono.runs.atomic_write import write_json, write_text


def pair_ratios(arms: list[dict]) -> list[dict]:
    """Consecutive (rlt, trl) or (trl, rlt) arms as pairs with ``ratio = rlt / trl`` of their median step."""
    if len(arms) % 2:
        raise ValueError(f"{len(arms)} arms: pairs need an even number")
    pairs = []
    for first, second in zip(arms[::2], arms[1::2]):
        by_mode = {first["mode"]: first, second["mode"]: second}
        if set(by_mode) != {"rlt", "trl"}:
            raise ValueError(f"a pair must hold one rlt and one trl arm, got {first['mode']}, {second['mode']}")
        rlt, trl = by_mode["rlt"]["median_step_seconds"], by_mode["trl"]["median_step_seconds"]
        pairs.append({"order": f"{first['mode']},{second['mode']}", "rlt_median_step_s": rlt,
                      "trl_median_step_s": trl, "ratio": rlt / trl})
    return pairs


def cycle_mean(step_seconds: list[float], steps_per_generation: int) -> float:
    """Mean step over the second whole generation cycle (the first holds the engine's warm-up)."""
    cycle = step_seconds[steps_per_generation: 2 * steps_per_generation]
    if len(cycle) < steps_per_generation:
        raise ValueError(f"{len(step_seconds)} steps hold no second cycle of {steps_per_generation}")
    return sum(cycle) / len(cycle)


# speed.sh's 0.5B memory=speed runs: the defaults, and the same without liger-kernel's layers (speed_noliger); the
# 2026-11-27 run at fd61d14 ran without them by default and with them as speed_liger.
SPEED_RUNS = ("speed", "speed_liger", "speed_noliger")
# speed.sh's 7B arms: noalign is manual with trainer.left_align_padding=false. Runs from before bench_mono.py
# recorded left_align_padding take theirs from the arm.
ARMS = ("manual", "noalign", "noliger", "auto", "speed")


def seven_b(runs: list[dict], device: str) -> list[dict]:
    """Each run's median step and phases beside their roofline at ``device``'s rates."""
    entries = []
    for run in runs:
        config = run["grpo_config"]
        work = Work(Arch.from_config(QWEN25_ARCHS[run["arch"]]), run["completions_per_step"], run["completion_length"],
                    run["prompt_length"], recompute=config["gradient_checkpointing"])
        bound = roofline(work, *DEVICES[device])
        phases = {phase: run.get(f"phase/{phase}/seconds") for phase in PHASES}
        entries.append({
            "arm": run.get("arm"), "memory": run["memory"], "status": run["status"],
            "median_step_s": run.get("median_step_seconds"),
            "step_seconds": run.get("step_seconds"), "phase_seconds": phases, "roofline_s": bound,
            "roofline_step_s": sum(bound.values()),
            "phase_ratio": {p: None if phases[p] is None else phases[p] / bound[p] for p in PHASES},
            "step_ratio": None if run.get("median_step_seconds") is None
            else run["median_step_seconds"] / sum(bound.values()),
            "settings": {k: config[k] for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                "steps_per_generation", "gradient_checkpointing", "optim",
                                                "vllm_gpu_memory_utilization")},
            "left_align_padding": run.get("left_align_padding", run.get("arm") != "noalign")})
    return entries


def read_raw(path: Path, parser: argparse.ArgumentParser) -> list[dict]:
    """``path``'s JSON; a file that is not whole JSON (a run cut off while writing it) is refused in one line."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        parser.error(f"{path} is not whole JSON ({err}): bring it back again from the run, "
                     "or move it out of the folder")


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--target", choices=["05b", "7b"], default="05b")
    a = parser.parse_args()
    if a.target == "7b":
        runs = [{**run, "arm": arm} for arm in ARMS if (a.folder / f"step_{arm}.json").exists()
                for run in read_raw(a.folder / f"step_{arm}.json", parser)]
        if not runs:
            parser.error(f"{a.folder} holds no 7B run (step_<arm>.json, arm one of {', '.join(ARMS)}): nothing to "
                         "summarise")
        a.out.mkdir(parents=True, exist_ok=True)
        write_json(a.out / "step.json", {
            "commit": a.commit, "device": a.device, "command": a.command, "goal": "step <= 1.3x its roofline",
            "work": "random-weight Qwen2.5-7B teacher and student, 32 completions x 4,096 forced tokens per step, "
                    "full fine-tuning, 8-bit Adam (bench/bench_mono.py)", "runs": seven_b(runs, a.device)}, indent=1)
        return
    if not (a.folder / "pairs_raw.json").exists():  # the speed runs' baseline is the same run's default arms
        parser.error(f"{a.folder} has no pairs_raw.json: the memory=speed runs are set against the pairs' rlt arms of "
                     "the same run, so run the 05b benchmark with at least one pair")
    raw = read_raw(a.folder / "pairs_raw.json", parser)
    speed_runs = {name: read_raw(a.folder / f"{name}_raw.json", parser)[0]  # <name>_raw.json -> <name>.json
                  for name in SPEED_RUNS if (a.folder / f"{name}_raw.json").exists()}
    arms = [arm for arm in raw if arm["status"] == "ok"]
    # A run stopped inside a pair leaves its first arm alone: it is reported apart, in no ratio.
    paired = len(arms) // 2 * 2
    unpaired = [{"mode": arm["mode"], "median_step_s": arm["median_step_seconds"]} for arm in arms[paired:]]
    if not paired:
        parser.error(f"{a.folder}/pairs_raw.json holds no whole pair ({len(arms)} arm(s) ran): nothing to compare")
    pairs = pair_ratios(arms[:paired])
    shared = {"commit": a.commit, "device": a.device, "command": a.command,
              "work": "random-weight Qwen2.5-0.5B teacher and student, 32 completions x 1,024 forced tokens per "
                      "optimizer step (bench/bench_mono.py)"}
    ratios = [p["ratio"] for p in pairs]
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "pairs.json", {
        **shared, "pairs": pairs, "median_ratio": statistics.median(ratios), "goal": "median ratio <= 1.0",
        "unpaired_arms": unpaired, "rlt_reward_micro_batch_size": next(  # the rlt arms' score micro-batch
            (arm["chosen"]["reward_micro_batch_size"] for arm in arms if "chosen" in arm), None),
        "settings": {arm["mode"]: arm["grpo_config"] for arm in arms[:2]}}, indent=1)
    default = statistics.median(p["rlt_median_step_s"] for p in pairs)
    lines = ["| pair | order | rlt s/step | TRL s/step | rlt / TRL |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {i} | {p['order']} | {p['rlt_median_step_s']:.2f} | {p['trl_median_step_s']:.2f} | {p['ratio']:.3f} |"
              for i, p in enumerate(pairs, 1)]
    lines += [f"| median | | | | {statistics.median(ratios):.3f} |", ""]
    if unpaired:
        lines += [f"Unpaired (the run stopped before its pair's other arm): {arm['mode']} "
                  f"{arm['median_step_s']:.2f} s/step" for arm in unpaired] + [""]
    for name, speed in speed_runs.items():
        config = speed["grpo_config"]
        per_generation = config["steps_per_generation"] // config["gradient_accumulation_steps"]  # optimizer steps
        step = cycle_mean(speed["step_seconds"], per_generation)
        tokens = speed["completions_per_step"] * speed["completion_length"]
        write_json(a.out / f"{name}.json", {
            **shared, "memory": speed["memory"], "use_liger_kernel": speed.get("use_liger_kernel", False),
            "optimizer_steps_per_generation": per_generation,
            "step_seconds": speed["step_seconds"], "cycle_mean_step_s": step, "default_median_step_s": default,
            "completion_tokens_per_s": tokens / step, "default_completion_tokens_per_s": tokens / default,
            "speedup": default / step, "goal": "speedup >= 3", "phases_of_the_generating_step": {
                k: v for k, v in speed.items() if k.startswith(("phase/", "perf/"))},
            "plan": speed["predicted_table"], "settings": config}, indent=1)
        lines.append(f"memory=speed{' with liger-kernel' if speed.get('use_liger_kernel') else ''}: "
                     f"{per_generation} optimizer steps per generation, {step:.2f} s per step over a whole cycle vs "
                     f"{default:.2f} s (the pairs' rlt median): {tokens / step:,.0f} vs {tokens / default:,.0f} "
                     f"completion tokens/s, {default / step:.2f}x")
    write_text(a.out / "table.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
