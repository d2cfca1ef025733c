"""kill -9 during a pipeline stage, then the same command again: does it end with the same files as a run that was
never interrupted? (Nothing a killed run had written is lost or silently changed.)

  python bench/kill_pipeline.py --out results/kill_pipeline_cpu.json

The embedded tiny pipeline (pipeline_tiny, small overrides) runs once uninterrupted; then, for each kill point, a
second run is killed with SIGKILL (the pipeline process only: its stage child dies with it, rlt_mono.stages.pipeline's
parent-death signal) as soon as the kill point's file appears, and the same command is run again on its folder.
Every file of the two folders is compared: JSON/JSONL by their values, leaving out what differs by nature (times,
speeds, memory, paths of the run folder); final/ weights tensor by tensor; other files byte for byte.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_mono import code_commit  # noqa: E402

from rlt_mono.runs.atomic_write import write_json  # noqa: E402

OVERRIDES = ["pipeline.teacher_sft.overrides=['size=tiny','sft.max_steps=4','sft.save_steps=2']",
             "pipeline.teacher_rlt.overrides=['trainer.max_steps=6','trainer.save_steps=2',"
             "'trainer.max_completion_length=24']",
             "pipeline.distill.overrides=['size=tiny','data.max_rows=8','distill.rows_per_batch=2']",
             "pipeline.student_sft.overrides=['size=tiny','sft.max_steps=4','sft.save_steps=2']",
             "pipeline.eval.overrides=['size=tiny','data.max_rows=3']"]
# kill point -> the file whose appearance triggers the kill (a glob inside the pipeline folder)
KILL_POINTS = {"teacher_rlt after its first checkpoint": "2_teacher_rlt/checkpoint-2/trainer_state.json",
               "distill after its first rows": "3_distill/distill.jsonl",
               "student_sft after its first checkpoint": "4_student_sft/checkpoint-2/trainer_state.json"}
# keys whose values differ between any two runs: wall times, speeds, memory readings, dates
VOLATILE = ("seconds", "runtime", "per_second", "gib", "memory", "time", "date", "flos", "tokens_per_s")
# training_args.bin pickles the run's arguments, resume_from_checkpoint and output folder included
SKIP_FILES = ("README.md", "config.yaml", ".lock", "eval_table.md", "training_args.bin")


def pipeline(folder: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlt_mono.cli", "pipeline_tiny", f"output_dir={folder}",
                             *OVERRIDES], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> None:
    _, err = process.communicate(timeout=1800)
    if process.returncode != 0:
        raise SystemExit(f"pipeline failed (exit {process.returncode}):\n{err[-3000:]}")


def kill_when(process: subprocess.Popen, trigger: Path) -> float:
    start = time.perf_counter()
    while not (trigger.is_file() and trigger.stat().st_size > 0):
        if process.poll() is not None:
            raise SystemExit(f"the pipeline ended before {trigger} appeared")
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return time.perf_counter() - start


def _clean(value, root: str):
    if isinstance(value, dict):
        return {k: _clean(v, root) for k, v in value.items() if not any(t in k for t in VOLATILE)}
    if isinstance(value, list):
        return [_clean(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(root, "<run>")
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _content(path: Path, root: Path):
    if path.suffix == ".jsonl":
        rows = [_clean(json.loads(line), str(root)) for line in path.read_text().splitlines() if line.strip()]
        return sorted(rows, key=json.dumps) if path.name == "distill.jsonl" else rows  # distill keys by question
    if path.suffix == ".json":
        return _clean(json.loads(path.read_text()), str(root))
    if path.suffix == ".safetensors":
        return {k: v.tobytes() for k, v in load_file(path).items()}
    return path.read_bytes()


def compare(a: Path, b: Path) -> dict:
    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "checkpoint-" not in str(p)
                and not any(s in p.name for s in SKIP_FILES) and ".aside-" not in str(p) and p.suffix != ".png"}

    only_a, only_b = sorted(files(a) - files(b)), sorted(files(b) - files(a))
    differ = {}
    for name in sorted(files(a) & files(b)):
        left, right = _content(a / name, a), _content(b / name, b)
        if left != right:
            differ[name] = _first_difference(left, right)
    return {"files": len(files(a) & files(b)), "only_uninterrupted": only_a, "only_killed": only_b, "differ": differ}


def _first_difference(left, right) -> str:
    """Where two contents first differ, e.g. ``row 3: loss 0.51 vs 0.52; rows 6 vs 7``."""
    if isinstance(left, list) and isinstance(right, list):
        for i, (x, y) in enumerate(zip(left, right)):
            if x != y:
                if isinstance(x, dict) and isinstance(y, dict):
                    keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
                    return f"row {i}: " + "; ".join(f"{k} {x.get(k)} vs {y.get(k)}" for k in keys[:4])
                return f"row {i}"
        return f"rows {len(left)} vs {len(right)}"
    if isinstance(left, dict) and isinstance(right, dict):
        keys = sorted(k for k in left.keys() | right.keys() if left.get(k) != right.get(k))
        return "keys " + ", ".join(keys[:6])
    return "bytes"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--point", action="append", choices=list(KILL_POINTS), dest="points",
                        help="only this kill point (repeatable; default: every one)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="kill-") as tmp:
        reference = Path(tmp) / "uninterrupted"
        finish(pipeline(reference))
        for point in args.points or KILL_POINTS:
            trigger = KILL_POINTS[point]
            folder = Path(tmp) / point.split()[0]
            after = kill_when(pipeline(folder), folder / trigger)
            finish(pipeline(folder))
            results[point] = {"killed_after_seconds": round(after, 1), **compare(reference, folder)}
            print(point, json.dumps(results[point]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {"commit": code_commit(mark_changes=True), "date": time.strftime("%Y-%m-%d"),
                                    "machine": "CPU, 2 cores", "command": " ".join(["python", *sys.argv]),
                                    "overrides": OVERRIDES, "kill_points": results}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
