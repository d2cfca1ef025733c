"""Try rlt_mono as a new user would, on inputs a user gets wrong (a mistake answers in one line, never a
traceback or silence).

Each case runs one command in a fresh folder and is classified from what the user sees:
  one-line   refused with exit 2 and one ``error: ...`` line, no traceback (what the case expects to be refused)
  handled    ran and exited 0 (what the case expects to be valid)
  traceback  a Python traceback reached the user
  silent     exited 0 where the input should have been refused (or refused a valid input)
  runaway    still running at the time limit

  python bench/tryout.py --out results/tryout_cpu.json [--only NAME ...]

Writes the JSON (each case: command, expectation, outcome, exit code, last stderr line, seconds) and prints a
markdown table. CPU only; tiny configs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_mono import code_commit  # noqa: E402

from rlt_mono.runs.atomic_write import write_json  # noqa: E402

TRAIN = [sys.executable, "-m", "rlt_mono.cli"]
FIT = [sys.executable, "-m", "rlt_mono.memory.planner"]
EVALUATE = [sys.executable, "-m", "rlt_mono.stages.eval"]
LIMIT_S = 240


@dataclass
class Case:
    name: str
    command: list[str]  # {tmp} is the case's fresh folder
    refused: bool = True  # True: the input is a mistake and must end in one line
    files: dict[str, bytes | str] = field(default_factory=dict)  # files to create under {tmp} first
    env: dict[str, str] = field(default_factory=dict)
    says: str = ""  # a fragment the one line must contain


# The SFT stages on the embedded tiny pair (student SFT on the rows' own traces: no distill run needed).
TEACHER_SFT = [*TRAIN, "teacher_sft", "size=tiny"]
STUDENT_SFT = [*TRAIN, "student_sft", "size=tiny", "data=embedded", "sft.explanation_column=reasoning_trace"]
EVAL_JSON = json.dumps({"metrics": {"student/accuracy": {"mean": 0.5, "ci95": [0.1, 0.9], "n": 2}}, "questions": 2,
                        "questions_sha256": "a"})
CASES = [
    # teacher/student SFT options
    Case("sft negative learning rate", [*TEACHER_SFT, "output_dir={tmp}/r", "sft.learning_rate=-1"],
         says="learning_rate"),
    Case("sft negative batch", [*TEACHER_SFT, "output_dir={tmp}/r",
                                "sft.per_device_train_batch_size=-2"], says="per_device_train_batch_size"),
    Case("sft zero accumulation", [*TEACHER_SFT, "output_dir={tmp}/r",
                                   "sft.gradient_accumulation_steps=0"], says="gradient_accumulation_steps"),
    Case("sft max_steps=0", [*TEACHER_SFT, "output_dir={tmp}/r", "sft.max_steps=0"], says="max_steps"),
    Case("sft max_length shorter than every row", [*TEACHER_SFT, "output_dir={tmp}/r",
                                                   "sft.max_length=4"], says="sft.max_length"),
    Case("sft max_length=0", [*TEACHER_SFT, "output_dir={tmp}/r", "sft.max_length=0"],
         says="max_length"),
    Case("teacher_sft with LoRA", [*TEACHER_SFT, "output_dir={tmp}/r", "model.lora_r=4"],
         says="lora_r"),
    Case("student_sft null model", [*STUDENT_SFT, "output_dir={tmp}/r",
                                    "student.model_name_or_path=null"], says="model_name_or_path"),
    Case("student_sft on a run folder instead of final/", [*STUDENT_SFT, "output_dir={tmp}/r",
                                                           "student.model_name_or_path={tmp}/run",
                                                           "student.gguf_file=null"],
         files={"run/final/config.json": "{}", "run/config.yaml": "stage: teacher_sft\n"}, says="final"),
    Case("output_dir is a file", [*TEACHER_SFT, "output_dir={tmp}/afile"], files={"afile": "x"},
         says="afile"),
    Case("unknown run config", [*TRAIN, "teacher_sftt"], says="teacher_sftt"),
    Case("unknown size", [*TRAIN, "teacher_sft", "size=tinyy"], says="size/tinyy"),
    Case("unknown key", [*TEACHER_SFT, "sft.learning_rat=1e-5"], says="learning_rat"),
    # RL options
    Case("RL lora on lm_head", [*TRAIN, "demo_tiny", "output_dir={tmp}/r", "model.lora_r=4",
                                "model.lora_target_modules=[lm_head]"], says="lm_head"),
    Case("RL zero steps", [*TRAIN, "demo_tiny", "output_dir={tmp}/r", "trainer.max_steps=0"], says="max_steps"),
    Case("RL cache is a file", [*TRAIN, "demo_tiny", "output_dir={tmp}/r"], files={"cachefile": "x"},
         env={"RLT_MONO_CACHE": "{tmp}/cachefile"}, says="RLT_MONO_CACHE"),
    Case("RL logging=wandb without wandb", [*TRAIN, "demo_tiny", "output_dir={tmp}/r", "logging=wandb"],
         says="wandb"),
    # distill / eval
    Case("distill with LoRA options", [*TRAIN, "distill", "size=tiny", "output_dir={tmp}/r", "model.lora_r=4"],
         says="lora"),
    Case("eval zero rows", [*TRAIN, "eval", "size=tiny", "output_dir={tmp}/r", "data.max_rows=0"], says="max_rows"),
    # compare / rescore
    Case("compare another JSON shape", [*EVALUATE, "compare", "{tmp}/a.json", "{tmp}/b.json"],
         files={"a.json": "[1, 2]", "b.json": EVAL_JSON}, says="a.json"),
    Case("compare a binary file", [*EVALUATE, "compare", "{tmp}/a.bin", "{tmp}/b.json"],
         files={"a.bin": bytes(range(256)), "b.json": EVAL_JSON}, says="a.bin"),
    Case("compare a missing file", [*EVALUATE, "compare", "{tmp}/nope.json", "{tmp}/b.json"],
         files={"b.json": EVAL_JSON}, says="nope.json"),
    Case("rescore without eval_rows.jsonl", [*EVALUATE, "rescore", "{tmp}/ev"], files={"ev/eval.json": EVAL_JSON},
         says="eval_rows.jsonl"),
    # the memory planner's command line
    Case("fit gpu-gib nan", [*FIT, "teacher_rlt_mono", "--gpu-gib", "nan"], says="--gpu-gib"),
    Case("fit gpu-gib 0", [*FIT, "teacher_rlt_mono", "--gpu-gib", "0"], says="--gpu-gib"),
    Case("fit free-gib above the card", [*FIT, "teacher_rlt_mono", "--gpu-gib", "80", "--free-gib", "200"],
         says="--free-gib"),
    Case("fit prompt-length 0", [*FIT, "teacher_rlt_mono", "--gpu-gib", "80", "--prompt-length", "0"],
         says="--prompt-length"),
    # valid inputs next to the mistakes: they must run
    Case("fit on an 80 GiB card", [*FIT, "teacher_rlt_mono", "--gpu-gib", "80", "--arch", "1.5b"], refused=False),
    Case("compare two evals", [*EVALUATE, "compare", "{tmp}/a.json", "{tmp}/b.json"],
         files={"a.json": EVAL_JSON, "b.json": EVAL_JSON}, refused=False),
    Case("help", [*TRAIN, "--help"], refused=False),
]


def run_case(case: Case) -> dict:
    with tempfile.TemporaryDirectory(prefix="tryout-") as tmp:
        for name, content in case.files.items():
            path = Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        command = [part.replace("{tmp}", tmp) for part in case.command]
        env = {**os.environ, **{k: v.replace("{tmp}", tmp) for k, v in case.env.items()}}
        start = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            return {"outcome": "runaway", "exit": None, "line": "", "seconds": LIMIT_S}
        seconds = round(time.perf_counter() - start, 1)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        if "Traceback (most recent call last)" in done.stderr:
            outcome = "traceback"
        elif case.refused:
            one_line = done.returncode == 2 and last.startswith("error:") and case.says.replace("{tmp}", tmp) in last
            outcome = "one-line" if one_line else ("silent" if done.returncode == 0 else "unclear")
        else:
            outcome = "handled" if done.returncode == 0 else "refused-valid"
        return {"outcome": outcome, "exit": done.returncode, "line": last.replace(tmp, "{tmp}")[:300],
                "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--only", nargs="*", help="run only the cases with these names")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    results = []
    for case in cases:
        result = {"case": case.name, "command": " ".join(case.command), "refused": case.refused, **run_case(case)}
        print(f"{result['outcome']:>10}  {case.name}: {result['line']}", flush=True)
        results.append(result)
    counts = Counter(r["outcome"] for r in results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {"commit": code_commit(mark_changes=True), "date": time.strftime("%Y-%m-%d"),
                                    "machine": "CPU, 2 cores", "counts": counts, "cases": results}, indent=1)
    print("\n| case | outcome | exit | what the user sees |\n| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['case']} | {r['outcome']} | {r['exit']} | {r['line'].replace('|', '/')} |")
    print(f"\n{dict(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
