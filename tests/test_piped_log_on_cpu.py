"""A tiny run whose output goes to a pipe (``./launch_mono.sh ... 2>&1 | tee log``, a pipeline stage's log): no
progress-bar redraws (``\\r``), one whole line per training step (rlt_mono.runs.console), in the RL and SFT stages
alike."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _piped_run(*args) -> str:
    """stdout and stderr of ``python -m rlt_mono.cli ...`` into one pipe, as ``2>&1 | tee log`` gets them."""
    result = subprocess.run([sys.executable, "-m", "rlt_mono.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout


def test_rl_run_into_a_pipe_logs_one_line_per_step(tmp_path):
    output = _piped_run("demo_tiny", f"output_dir={tmp_path}", "trainer.max_steps=2")
    lines = output.split("\n")
    assert not [line for line in lines if "\r" in line]
    steps = [re.fullmatch(r"\S+ \S+ INFO rlt_mono\.runs\.console: step (\d+)/2 \| reward .* s/step .*", line)
             for line in lines]
    assert [int(match[1]) for match in steps if match] == [1, 2]
    assert len([line for line in lines if re.search(r"\bstep \d+/2\b", line)]) == 3  # the 2 steps and "done: step 2/2"


def test_sft_run_into_a_pipe_logs_one_line_per_step(tmp_path):
    output = _piped_run("teacher_sft", "size=tiny", f"output_dir={tmp_path}", "sft.max_steps=2",
                        "sft.diversity_prompts=0", "sft.per_device_train_batch_size=8",
                        "sft.gradient_accumulation_steps=1", "data.eval_rows=8")
    assert "\r" not in output
    lines = output.split("\n")
    # the compact line, not transformers' PrinterCallback dict
    steps = [re.fullmatch(r"\S+ \S+ INFO rlt_mono\.runs\.console: step (\d+)/2 \| loss \S+ \| lr \S+ \| \S+ s/step",
                          line)
             for line in lines]
    assert [int(match[1]) for match in steps if match] == [1, 2]
    assert not [line for line in lines if "{'" in line]
    assert not [line for line in lines if "it/s]" in line or "s/it]" in line]  # no bar anywhere
